"""The daemon as a real process: jobs over the HTTP API, a kill -9 with a job in flight, a restart that
finishes it, memory feeding a later job, and a graceful SIGTERM stop."""

from __future__ import annotations

import pytest
import os
import signal
import time
from pathlib import Path
from typing import Any

from maxkernel.config import load_settings
from memory import Store
from support import http_json as _http

TASK = "12p_RMSNorm"
BUDGET = {"max_evaluations": 3, "tune_max_trials": 1, "max_iterations": 2, "patience": 1, "time_s": 240}


def _wait(predicate: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def _job(port: int, job_id: str) -> dict[str, Any]:
    return _http(port, "GET", f"/jobs/{job_id}")[1]


@pytest.mark.slow
def test_daemon_survives_kill_with_a_job_in_flight(fast_env: dict[str, str], tmp_path: Path) -> None:
    from orchestrators.daemon import read_state, spawn, stop

    settings = load_settings()
    state = spawn(settings, concurrency=2)
    assert _http(state.port, "GET", "/status")[1]["pid"] == state.pid
    code, first = _http(state.port, "POST", "/jobs", {"task": TASK, "priority": 5, "budget": BUDGET})
    assert code == 201 and first["status"] == "queued"
    assert _http(state.port, "POST", "/jobs", {"task": TASK, "budget": {"max_evaluations": "many"}})[0] == 400
    assert _http(state.port, "GET", "/jobs/ffff")[0] == 404

    # Kill the daemon hard once the job has a draft under evaluation.
    store = Store.open(settings.resolved_store_url)
    started = [state.pid]
    try:
        def drafting() -> bool:
            job = _job(state.port, first["id"])
            return job["status"] == "running" and job["session_id"] and any(
                e.message_type == "KernelDraft" for e in store.events(session_id=job["session_id"]))

        _wait(drafting, 120, "the first job to draft a kernel")
        os.kill(state.pid, signal.SIGKILL)
        os.waitpid(state.pid, 0)
        assert read_state(settings) is None

        again = spawn(settings, concurrency=2)
        started.append(again.pid)
        assert again.pid != state.pid
        port = again.port
        assert _http(port, "GET", f"/jobs/{first['id']}/result")[0] in (409, 200)
        done = _wait(lambda: (j := _job(port, first["id"]))["status"] in ("done", "failed") and j, 200, "the job")
        assert done["status"] == "done", done
        assert done["attempts"] == 2 and len(done["sessions"]) == 2
        code, result = _http(port, "GET", f"/jobs/{first['id']}/result")
        assert code == 200 and result["best_report"]["status"] == "ok" and result["best_source"]
        assert result["remembered_kernel"]  # the best Pallas kernel, even when the reference timed faster
        # The run again carried the killed session's evaluations instead of starting from scratch.
        killed = [e.message_type for e in store.events(session_id=done["sessions"][0])]
        assert result["resumed_evaluations"] == killed.count("EvalReport") + killed.count("FixRequest")

        # The job's report covers both of its sessions (the killed one and the one that finished it).
        from orchestrators.report import write_report

        html = write_report(store, first["id"], tmp_path / "job.html").read_text()
        assert "daemon job" in html and html.count("data:image/png;base64,") == 3 and "def kernel" in html

        # A later job on the same task starts from the kernel the first one left in memory.
        code, later = _http(port, "POST", "/jobs", {"task": TASK, "budget": BUDGET})
        finished = _wait(lambda: (j := _job(port, later["id"]))["status"] in ("done", "failed") and j, 200, "job 2")
        assert finished["status"] == "done", finished
        plans = [e.payload for e in store.events(session_id=finished["session_id"]) if e.message_type == "Plan"]
        assert plans[0]["strategies"][0]["kind"] == "recalled"
        listed = _http(port, "GET", "/jobs")[1]
        assert {j["id"] for j in listed} == {first["id"], later["id"]}
        status = _http(port, "GET", "/status")[1]
        assert status["finished"] == 2 and status["peak_running"] <= 2 and status["jobs"] == {"done": 2}

        assert stop(settings) == again.pid  # SIGTERM: a graceful exit that removes the state file
        assert read_state(settings) is None and not (settings.data_path / "daemon.json").exists()
    finally:
        store.close()
        for pid in started:  # only the daemons this test started, whatever failed above
            try:
                os.kill(pid, signal.SIGTERM)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
