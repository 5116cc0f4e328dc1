"""The evaluator pool forks its workers from a fork server that imported them once: a forked worker enters
the same sandbox as one started afresh, a dead fork server is replaced at the next worker, and the switch
off starts each worker afresh."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from jaxbench.pool import WorkerPool


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])


def test_a_forked_worker_is_sandboxed_as_a_fresh_one_and_a_dead_server_is_replaced() -> None:
    with WorkerPool(1, fork_server=False) as fresh_pool:
        fresh = fresh_pool.acquire()
        assert _parent(fresh.proc.pid) == os.getpid()
        layers = fresh.layers
        fresh_pool.release(fresh)
    with WorkerPool(1) as pool:
        worker = pool.acquire()
        server = pool._zygote
        assert server is not None and _parent(worker.proc.pid) == server.proc.pid
        assert worker.layers == layers  # rlimits, network namespace, audit hook: the same layers
        pool.release(worker)
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait(timeout=10)
        again = pool.start_worker()  # a new server forks it
        assert pool._zygote is not None and pool._zygote is not server
        assert _parent(again.proc.pid) == pool._zygote.proc.pid and again.layers == layers
        again.close()


def test_the_switch_off_starts_every_worker_afresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JAXBENCH_FORK_SERVER", "0")
    with WorkerPool(1) as pool:
        worker = pool.acquire()
        assert pool._zygote is None and _parent(worker.proc.pid) == os.getpid()
        pool.release(worker)
