"""A standby daemon gets ready and claims nothing; sent SIGUSR1 (what its supervisor does when a daemon
dies) it takes the queued jobs at once.

The jobs ask for a model brain with no API key, so each one ends (failed, with that one line) as soon as a
daemon has claimed it and started its session: what is checked is who ran what, not the optimization."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from memory import Store
from orchestrators.auto import AutoBudget
from orchestrators.jobs import JobQueue, JobSpec

from conftest import stop_all
from test_worker_supervision import Lines

ROOT = Path(__file__).resolve().parents[2]
JOBS = 3


def test_a_standby_daemon_claims_nothing_until_promoted(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    with Store.open(url) as store:
        queue = JobQueue(store.engine)
        ids = [queue.submit(JobSpec(task="12p_RMSNorm", brain="gemini", budget=AutoBudget(max_evaluations=1))).id
               for _ in range(JOBS)]
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env |= {"JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT), "MAXKERNEL_DATA_DIR": str(tmp_path / "d"),
            "MAXKERNEL_STORE_URL": url}
    log = tmp_path / "daemon.log"
    procs: list[subprocess.Popen[str]] = []
    try:
        daemon = subprocess.Popen([sys.executable, "-m", "orchestrators.daemon", "--standby", "--concurrency", "1",
                                   "--poll", "0.1"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=log.open("w"),
                                  text=True, start_new_session=True)
        procs.append(daemon)
        lines = Lines(daemon, log)
        lines.wait_for("standby", 180)
        state = json.loads((tmp_path / "d" / "daemon.json").read_text())
        assert state["pid"] == daemon.pid and state["standby"] is True
        with urllib.request.urlopen(f"http://127.0.0.1:{state['port']}/status", timeout=10) as response:
            assert json.loads(response.read())["standby"] is True  # its API serves while it waits
        time.sleep(1.0)  # ten of its polls: a daemon that claims would have taken a job by now
        with Store.open(url) as store:
            queue = JobQueue(store.engine)
            assert [(queue.get(i).status, queue.get(i).attempts) for i in ids] == [("queued", 0)] * JOBS

            daemon.send_signal(signal.SIGUSR1)
            lines.wait_for("ready daemon", 60)
            deadline = time.monotonic() + 120
            while any(queue.get(i).status in ("queued", "running") for i in ids):
                assert time.monotonic() < deadline, [queue.get(i).status for i in ids]
                time.sleep(0.1)
            jobs = [queue.get(i) for i in ids]
        for job in jobs:
            assert job.status == "failed" and "API key" in (job.error or ""), job.error
            assert job.attempts == 1 and int(str(job.owner).split(":")[1]) == daemon.pid
        assert json.loads((tmp_path / "d" / "daemon.json").read_text())["standby"] is False
    finally:
        stop_all(procs)
