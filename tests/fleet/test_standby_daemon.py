"""A standby daemon gets ready and claims nothing; sent SIGUSR1 (what its supervisor does when a daemon
dies) it takes the queued jobs at once. Under ``--supervise`` the dead daemon's slot goes to the spare and
a new spare starts behind it.

The jobs ask for a model brain with no API key, so each one ends (failed, with that one line) as soon as a
daemon has claimed it and started its session: what is checked is who ran what, not the optimization."""

from __future__ import annotations

import pytest
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


def _submit(url: str) -> list[str]:
    with Store.open(url) as store:
        queue = JobQueue(store.engine)
        return [queue.submit(JobSpec(task="12p_RMSNorm", brain="gemini", budget=AutoBudget(max_evaluations=1))).id
                for _ in range(JOBS)]


def _owners_when_ended(url: str, ids: list[str]) -> set[int]:
    """The pids of the daemons that ran ``ids``, once every one has ended (each failed for want of a key)."""
    with Store.open(url) as store:
        queue = JobQueue(store.engine)
        deadline = time.monotonic() + 120
        while any(queue.get(i).status in ("queued", "running") for i in ids):
            assert time.monotonic() < deadline, [queue.get(i).status for i in ids]
            time.sleep(0.1)
        jobs = [queue.get(i) for i in ids]
    for job in jobs:
        assert job.status == "failed" and "API key" in (job.error or ""), job.error
        assert job.attempts == 1
    return {int(str(job.owner).split(":")[1]) for job in jobs}


def _daemon(args: list[str], data_dir: Path, url: str, log: Path) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env |= {"JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT), "MAXKERNEL_DATA_DIR": str(data_dir),
            "MAXKERNEL_STORE_URL": url}
    return subprocess.Popen([sys.executable, "-m", "orchestrators.daemon", "--concurrency", "1", "--poll", "0.1",
                             *args], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=log.open("w"), text=True,
                            start_new_session=True)


@pytest.mark.slow
def test_a_standby_daemon_claims_nothing_until_promoted(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    ids = _submit(url)
    log = tmp_path / "daemon.log"
    procs: list[subprocess.Popen[str]] = []
    try:
        daemon = _daemon(["--standby"], tmp_path / "d", url, log)
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
        assert _owners_when_ended(url, ids) == {daemon.pid}
        assert json.loads((tmp_path / "d" / "daemon.json").read_text())["standby"] is False
    finally:
        stop_all(procs)


@pytest.mark.slow
def test_the_supervisor_puts_its_standby_daemon_in_a_dead_daemons_place(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    Store.open(url).close()
    log = tmp_path / "daemons.log"
    procs: list[subprocess.Popen[str]] = []
    try:
        supervisor = _daemon(["--supervise", "--count", "1", "--spares", "1"], tmp_path / "fleet", url, log)
        procs.append(supervisor)
        lines = Lines(supervisor, log)
        lines.wait_for("ready 0", 180)
        lines.wait_for("standby ", 180)
        serving = int(lines.wait_for("started 0 ")[0].split()[2])
        spare = int(lines.wait_for("spare ")[0].split()[1])
        assert _owners_when_ended(url, _submit(url)) == {serving}  # the spare, warm beside it, took none

        os.killpg(serving, signal.SIGKILL)
        lines.wait_for(f"promoted 0 {spare}", 30)
        assert _owners_when_ended(url, _submit(url)) == {spare}
        behind = int(lines.wait_for("spare ", count=2)[1].split()[1])  # a new spare, started behind it
        lines.wait_for(f"standby {behind}", 180)
        homes = {json.loads(p.read_text())["pid"]: p.parent.name
                 for p in (tmp_path / "fleet" / "daemons").glob("*/daemon.json")}
        assert len({homes[serving], homes[spare], homes[behind]}) == 3  # a data folder each
        # and one cache for all: what one daemon compiled, the next started reads back
        assert any((tmp_path / "fleet" / "jax").iterdir())
        assert not list((tmp_path / "fleet" / "daemons").glob("*/jax"))
    finally:
        stop_all(procs)
