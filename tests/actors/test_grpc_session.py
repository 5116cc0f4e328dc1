"""A full optimization across processes on AutoGen's gRPC runtime, on loopback: a host process, one worker
process with the evaluator's actor (tester), one with every other actor, and this process starting the
session as one more worker."""

from __future__ import annotations

import pytest
import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from actors import ActorConfig
from actors.distributed import run_remote_session
from memory import Store
from transcripts import TASK, gemm_session

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(args: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=log.open("w"), text=True)


def _worker(host: str, roles: str, config: Path, log: Path) -> subprocess.Popen:
    return _spawn(["actors.worker", "--host", host, "--roles", roles, "--config", str(config)], log)


def _wait_ready(proc: subprocess.Popen, log: Path, timeout_s: float = 120, prefix: str = "ready") -> str:
    deadline = time.monotonic() + timeout_s
    assert proc.stdout is not None
    os.set_blocking(proc.stdout.fileno(), False)
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith(prefix):
            return line.strip()
        if proc.poll() is not None:
            raise AssertionError(f"worker exited {proc.returncode}: {log.read_text()[-3000:]}")
        time.sleep(0.1)
    raise AssertionError(f"worker not ready after {timeout_s} s: {log.read_text()[-3000:]}")


def _wait_recorded(store_url: str, session_id: str, timeout_s: float = 30) -> None:
    """The recorder hears SessionFinished when we do: give it time to write before the workers stop."""
    deadline = time.monotonic() + timeout_s
    with Store.open(store_url) as store:
        while time.monotonic() < deadline:
            if any(e.message_type == "SessionFinished" for e in store.events(session_id=session_id)):
                return
            time.sleep(0.1)


@pytest.mark.slow
def test_session_across_grpc_workers(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    config = ActorConfig(brain="llm", model="replay", transcript=gemm_session(tmp_path / "gemm.jsonl"),
                         data_dir=str(data), eval_timing_rounds=2, eval_correctness_seeds=1)
    config_file = tmp_path / "actors.json"
    config_file.write_text(config.model_dump_json())
    address = f"127.0.0.1:{_free_port()}"
    store_url = f"sqlite:///{data / 'maxkernel.db'}"

    async def scenario() -> tuple:
        host_log = tmp_path / "host.log"
        host = _spawn(["actors.host", address], host_log)
        procs = [(host, host_log)]
        try:
            await asyncio.to_thread(_wait_ready, host, host_log, 60, "host listening")
            procs += [(_worker(address, "tester", config_file, tmp_path / "tester.log"), tmp_path / "tester.log"),
                      (_worker(address, "planner,coder,debugger,profiler,tuner,librarian,recorder", config_file,
                               tmp_path / "rest.log"), tmp_path / "rest.log")]
            ready = [await asyncio.to_thread(_wait_ready, p, log) for p, log in procs[1:]]
            finished = await run_remote_session(address, TASK, store_url=store_url, brain="llm:replay", timeout_s=300)
            await asyncio.to_thread(_wait_recorded, store_url, finished.session_id)
            return ready, finished
        finally:
            for p, _ in reversed(procs):  # workers first, then the host
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()

    ready, finished = asyncio.run(scenario())
    assert ready == ["ready tester", "ready planner,coder,debugger,profiler,tuner,librarian,recorder"]
    assert finished.status == "scored", finished.reason
    assert finished.best is not None and finished.best.report.passed

    with Store.open(store_url) as store:
        events = store.events(session_id=finished.session_id)
        types = [e.message_type for e in events]
        # Judged in the tester's process, planned, fixed and recorded in the other: the whole flow is logged.
        for step in ("OptimizeRequest", "Plan", "KernelDraft", "FixRequest", "EvalReport", "ProfileReport",
                     "TuneReport", "CandidateScored", "SessionFinished"):
            assert step in types, (step, types)
        order = [types.index(t) for t in ("Plan", "FixRequest", "ProfileReport", "TuneReport", "CandidateScored")]
        assert order == sorted(order)
        fix = events[types.index("FixRequest")].payload
        assert fix["report"]["status"] == "compile_error" and fix["sender"] == "tester"
        assert store.get_session(finished.session_id).status == "scored"
