"""Tester workers (two on one host, the load spread over them) killed in the middle of an evaluation:
their supervisor starts others, the host gives the evaluation to one of them, and the session finishes
with every candidate judged once in the record."""

from __future__ import annotations

import pytest
import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from actors import ActorConfig
from actors.distributed import run_remote_session
from maxkernel.messages import Budget
from memory import Store

from conftest import stop_all

ROOT = Path(__file__).resolve().parents[2]
TASK = "41k_Gemm_Add_ReLU"


def spawn(args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    full = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.Popen([sys.executable, "-m", *args], cwd=ROOT, env=full, stdout=subprocess.PIPE,
                            stderr=log.open("w"), text=True, start_new_session=True)


class Lines:
    """The stdout lines of a process, read without blocking."""

    def __init__(self, proc: subprocess.Popen[str], log: Path) -> None:
        assert proc.stdout is not None
        os.set_blocking(proc.stdout.fileno(), False)
        self.proc, self.log, self.seen = proc, log, []

    def wait_for(self, prefix: str, timeout_s: float = 120, count: int = 1) -> list[str]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc.stdout is not None
            line = self.proc.stdout.readline()
            if line:
                self.seen.append(line.strip())
            found = [s for s in self.seen if s.startswith(prefix)]
            if len(found) >= count:
                return found
            if self.proc.poll() is not None:
                raise AssertionError(f"process exited {self.proc.returncode}: {self.log.read_text()[-3000:]}")
            if not line:
                time.sleep(0.05)
        raise AssertionError(f"no {count} x {prefix!r} after {timeout_s} s: {self.seen} {self.log.read_text()[-3000:]}")


def host_and_testers(folder: Path, address: str, count: int, config_file: Path,
                     procs: list[subprocess.Popen[str]]) -> "Lines":
    """The gRPC host (listening) and a supervisor of ``count`` tester workers; the supervisor's lines."""
    host = spawn(["actors.host", address], folder / "host.log")
    procs.append(host)
    Lines(host, folder / "host.log").wait_for("host listening", 60)
    testers = spawn(["actors.worker", "--supervise", "--count", str(count), "--host", address, "--roles", "tester",
                     "--config", str(config_file)], folder / "testers.log")
    procs.append(testers)
    return Lines(testers, folder / "testers.log")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_a_worker_killed_mid_evaluation_is_replaced_and_the_evaluation_rerun_once(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    config = ActorConfig(data_dir=str(data), eval_timing_rounds=2, eval_correctness_seeds=1)
    config_file = tmp_path / "actors.json"
    config_file.write_text(config.model_dump_json())
    address = f"127.0.0.1:{_free_port()}"
    store_url = f"sqlite:///{data / 'maxkernel.db'}"
    Store.open(store_url).close()
    procs: list[subprocess.Popen[str]] = []
    try:
        supervised = host_and_testers(tmp_path, address, 2, config_file, procs)
        rest = spawn(["actors.worker", "--host", address, "--roles",
                      "planner,coder,debugger,profiler,tuner,librarian,recorder", "--config", str(config_file)],
                     tmp_path / "rest.log")
        procs.append(rest)
        supervised.wait_for("ready ", count=2)
        Lines(rest, tmp_path / "rest.log").wait_for("ready ")
        first = {line.split()[1]: int(line.split()[2]) for line in supervised.wait_for("started ", count=2)}

        async def scenario() -> object:
            session = asyncio.create_task(run_remote_session(
                address, TASK, store_url=store_url, budget=Budget(tune_max_trials=1, tune_budget_s=20), timeout_s=400))
            with Store.open(store_url) as store:  # kill the tester as soon as it has a draft to judge
                deadline = time.monotonic() + 200
                while not any(e.message_type == "KernelDraft" for e in store.events()):
                    assert time.monotonic() < deadline and not session.done(), "no draft was sent to the tester"
                    await asyncio.sleep(0.05)
                judged = [e for e in store.events() if e.payload.get("sender") == "tester"]
            assert judged == []  # both testers killed mid-evaluation, before any verdict
            for pid in first.values():
                os.killpg(pid, signal.SIGKILL)
            return await session

        finished = asyncio.run(scenario())
        started = supervised.wait_for("started ", count=4)
        assert not {int(line.split()[2]) for line in started[2:]} & set(first.values())  # both replaced
        assert finished.status == "scored", finished.reason
        deadline = time.monotonic() + 30
        with Store.open(store_url) as store:
            while not any(e.message_type == "SessionFinished" for e in store.events(session_id=finished.session_id)):
                assert time.monotonic() < deadline
                time.sleep(0.1)
            events = store.events(session_id=finished.session_id)
        verdicts = Counter(e.candidate_id for e in events if e.payload.get("sender") == "tester"
                           and e.message_type in ("EvalReport", "FixRequest"))
        drafts = {e.candidate_id for e in events if e.message_type == "KernelDraft"}
        # every draft judged, the killed one included (tuning trials are judged too, without a draft)
        assert drafts and drafts <= set(verdicts)
        assert set(verdicts.values()) == {1}  # and none twice
    finally:
        stop_all(procs)
