"""Two daemon processes on one PostgreSQL queue: every job is run by exactly one of them, and both work.

The jobs ask for a model brain with no API key, so each one ends (failed, with that one line) as soon as
a daemon has claimed it and started its session: what is checked is who ran what, not the optimization."""

from __future__ import annotations

import pytest
import os
import subprocess
import sys
import time
from pathlib import Path

from memory import Store
from orchestrators.auto import AutoBudget
from orchestrators.jobs import JobQueue, JobSpec

from conftest import stop_all

ROOT = Path(__file__).resolve().parents[2]
JOBS = 16


def _daemon(data_dir: Path, store_url: str, log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env |= {"JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT), "MAXKERNEL_DATA_DIR": str(data_dir),
            "MAXKERNEL_STORE_URL": store_url}
    return subprocess.Popen([sys.executable, "-m", "orchestrators.daemon", "--concurrency", "2", "--poll", "0.1"],
                            cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)


@pytest.mark.slow
def test_two_daemons_on_one_postgresql_never_run_the_same_job(pg_url: str, tmp_path: Path) -> None:
    Store.open(pg_url).close()
    procs = [_daemon(tmp_path / f"d{i}", pg_url, tmp_path / f"d{i}.log") for i in range(2)]
    try:
        deadline = time.monotonic() + 180
        for i, proc in enumerate(procs):  # both serving before any job exists, so both may claim
            while not (tmp_path / f"d{i}" / "daemon.json").exists():
                assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / f"d{i}.log").read_text()[-2000:]
                time.sleep(0.1)
        pids = {p.pid for p in procs}
        with Store.open(pg_url) as store:
            queue = JobQueue(store.engine)
            ids = [queue.submit(JobSpec(task="12p_RMSNorm", brain="gemini", budget=AutoBudget(max_evaluations=1))).id
                   for _ in range(JOBS)]
            while any(queue.get(i).status in ("queued", "running") for i in ids):
                assert time.monotonic() < deadline, [queue.get(i).status for i in ids]
                time.sleep(0.2)
            jobs = [queue.get(i) for i in ids]
        for job in jobs:
            assert job.status == "failed" and "API key" in (job.error or ""), job.error
            assert job.attempts == 1 and len(job.sessions) == 1  # claimed once, one session started
        owners = {int(str(job.owner).split(":")[1]) for job in jobs}
        assert owners == pids  # the queue was shared by both daemons
    finally:
        stop_all(procs)
