"""A model layer submitted to a real daemon on loopback runs as a whole-layer job: its regions are sessions
of the job, and the judged layer file and per-region rows come back as the job's result."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from jaxbench.task import load_task
from maxkernel.config import load_settings
from maxkernel.evaluation import evaluate_candidate
from support import http_json as _http
from test_daemon import _wait

LAYER = "mamba2_block"  # the smallest layer: three regions


@pytest.mark.slow
def test_submitted_model_layer_runs_optimize_model(fast_env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    from maxkernel.cli import app
    from orchestrators.daemon import spawn, stop

    settings = load_settings()
    state = spawn(settings, concurrency=1)
    try:
        with pytest.raises(SystemExit) as done:
            app(args=["submit", LAYER, "--budget", "120", "--evals", "6"], prog_name="maxkernel")
        assert done.value.code in (0, None)
        job_id = capsys.readouterr().out.strip().splitlines()[-1]

        def finished() -> dict[str, Any] | None:
            job = _http(state.port, "GET", f"/jobs/{job_id}")[1]
            return job if job["status"] in ("done", "failed") else None

        job = _wait(finished, 300, "the model job")
        assert job["status"] == "done", job
        code, result = _http(state.port, "GET", f"/jobs/{job_id}/result")
        assert code == 200 and result["layer"] == LAYER and result["correct"]
        rows = result["regions"]
        assert [r["index"] for r in rows] == list(range(len(rows))) and len(rows) == 3
        ran = [r["session_id"] for r in rows if r["session_id"]]
        assert ran and set(ran) == set(job["sessions"])  # every region session is one of the job's sessions
        path = Path(result["kernel_path"])
        assert path.is_relative_to(settings.data_path / "models" / job_id)
        report = evaluate_candidate(load_task(LAYER), path.read_text(), target="cpu")
        assert report.correct, report.reason
    finally:
        stop(settings)
        try:  # only the daemon this test started, whatever failed above
            os.kill(state.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
