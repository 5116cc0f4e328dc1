"""The zygote forks each process of a program with its imports already done: the child runs the program's
``main`` in a session of its own, with its own environment and stdout, SIGUSR1 held back, and its exit code
(or the signal that killed it) comes back to the supervisor; SIGTERM does not stop the zygote."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from jaxbench.zygote import Zygote

HERE = Path(__file__).resolve().parent


def _said(line: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in line.split())


def test_forked_processes_run_main_with_their_own_env_session_and_exit_code(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    zygote = Zygote("zygote_program")
    try:
        assert zygote.proc.pid not in (os.getpid(), None)
        os.kill(zygote.proc.pid, signal.SIGTERM)  # a fleet stopped by process group: the zygote stays for its exits
        time.sleep(0.3)
        assert zygote.alive
        first = zygote.spawn(["done", "3"], {**os.environ, "ZYGOTE_TEST": "one"})
        second = zygote.spawn(["wait"], {**os.environ, "ZYGOTE_TEST": "two"})
        said = _said(first.stdout.readline())
        assert said["pid"] == str(first.pid) and said["args"] == "done,3" and said["env"] == "one"
        assert said["imported_by"] == str(zygote.proc.pid)  # its imports were the zygote's
        assert said["session"] == str(first.pid)  # its own session and process group
        assert said["usr1_held"] == "True"  # until the program arms its promotion
        assert first.wait(30) == 3
        waiting = _said(second.stdout.readline())
        assert waiting["env"] == "two" and waiting["imported_by"] == str(zygote.proc.pid)
        assert second.poll() is None
        os.killpg(second.pid, signal.SIGKILL)
        assert second.wait(30) == -signal.SIGKILL
    finally:
        zygote.close()
    assert zygote.proc.returncode == 0  # the closed socket ends it


def _gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        if Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z":
            return True
        time.sleep(0.05)
    return False


def test_a_dead_zygote_takes_its_children_with_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    zygote = Zygote("zygote_program")
    try:
        child = zygote.spawn(["wait"], dict(os.environ))
        assert _said(child.stdout.readline())["args"] == "wait"
        os.kill(zygote.proc.pid, signal.SIGKILL)  # what its death with its supervisor (SIGKILL) comes to
        assert _gone(child.pid, 30)  # no process outlives it unwatched
        assert child.wait(30) < 0 and not zygote.alive
    finally:
        zygote.close()
