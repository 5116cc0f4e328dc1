"""A daemon whose jobs are judged by the fleet's supervised tester worker: the worker is killed in the
middle of the job's first evaluation, its supervisor starts another, the host gives it the evaluation, and
the job finishes with every candidate judged once in the record and nothing judged in the daemon itself."""

from __future__ import annotations

import pytest
import json
import os
import signal
import subprocess
import time
import urllib.request
from collections import Counter
from pathlib import Path

from actors import ActorConfig
from memory import Store
from orchestrators.auto import AutoBudget
from orchestrators.jobs import JobQueue, JobSpec

from conftest import free_port, stop_all
from test_worker_supervision import host_and_testers, spawn

TASK = "12p_RMSNorm"


def _children(pid: int) -> list[int]:
    """Children of ``pid``, started from any of its threads."""
    children: list[int] = []
    for thread in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children += [int(c) for c in (thread / "children").read_text().split()]
        except OSError:
            pass
    return children


def _evaluator_children(pid: int) -> list[int]:
    """Processes under ``pid`` that run the sandboxed evaluator worker: the workers, and the fork server
    (``jaxbench.zygote``) the judge's pool forks them from."""
    found, todo = [], _children(pid)
    while todo:
        child = todo.pop()
        try:
            if b"jaxbench.worker" in Path(f"/proc/{child}/cmdline").read_bytes():
                found.append(child)
                todo += _children(child)
        except OSError:
            pass
    return found


def _cpu_ticks(pid: int) -> int:
    """CPU time ``pid`` has used (clock ticks): an idle sandbox uses none."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return int(fields[11]) + int(fields[12])


@pytest.mark.slow
def test_a_daemon_job_is_judged_by_the_fleet_and_survives_its_tester_being_killed(tmp_path: Path) -> None:
    tester_data, daemon_data = tmp_path / "tester", tmp_path / "daemon"
    tester_data.mkdir()
    daemon_data.mkdir()
    store_url = f"sqlite:///{tmp_path / 'fleet.db'}"
    config_file = tmp_path / "tester.json"
    config_file.write_text(ActorConfig(data_dir=str(tester_data), store_url=store_url, eval_timing_rounds=2,
                                       eval_correctness_seeds=1).model_dump_json())
    address = f"127.0.0.1:{free_port()}"
    with Store.open(store_url) as store:
        job = JobQueue(store.engine).submit(JobSpec(task=TASK, budget=AutoBudget(
            time_s=240, max_evaluations=2, tune_max_trials=1, max_iterations=1, confirm=False)))
    procs: list[subprocess.Popen[str]] = []
    try:
        supervised = host_and_testers(tmp_path, address, 1, config_file, procs)
        supervised.wait_for("ready ")
        first = int(supervised.wait_for("started ")[0].split()[2])
        daemon = spawn(["orchestrators.daemon", "--concurrency", "1", "--poll", "0.2", "--testers", address],
                        tmp_path / "daemon.log", {"MAXKERNEL_DATA_DIR": str(daemon_data), "MAXKERNEL_STORE_URL": store_url})
        procs.append(daemon)

        sandboxes = _evaluator_children(first)
        assert sandboxes  # started before the worker said it was ready
        idle = {pid: _cpu_ticks(pid) for pid in sandboxes}
        with Store.open(store_url) as store:
            queue = JobQueue(store.engine)
            deadline = time.monotonic() + 240
            while True:  # the first draft is recorded and the tester worker's evaluator is at work on it
                assert time.monotonic() < deadline, (tmp_path / "daemon.log").read_text()[-3000:]
                assert daemon.poll() is None, (tmp_path / "daemon.log").read_text()[-3000:]
                session = queue.get(job.id).session_id
                events = store.events(session_id=session) if session else []
                if any(e.message_type == "KernelDraft" for e in events) and any(
                        _cpu_ticks(pid) > idle[pid] + 2 for pid in sandboxes):
                    break
                time.sleep(0.05)
            assert not [e for e in events if e.payload.get("sender") == "tester"]  # no verdict yet
            os.killpg(first, signal.SIGKILL)

            while queue.get(job.id).status in ("queued", "running"):
                assert time.monotonic() < deadline, (tmp_path / "daemon.log").read_text()[-3000:]
                time.sleep(0.2)
            done = queue.get(job.id)
            assert done.status == "done" and done.attempts == 1, done.error
            events = store.events(session_id=done.session_id)

        replacement = supervised.wait_for("started ", count=2)[1]
        assert int(replacement.split()[2]) != first
        verdicts = Counter(e.candidate_id for e in events if e.payload.get("sender") == "tester"
                           and e.message_type in ("EvalReport", "FixRequest"))
        drafts = {e.candidate_id for e in events if e.message_type == "KernelDraft"}
        # the draft cut off by the kill was judged too (tuning trials are judged without a draft)
        assert drafts and drafts <= set(verdicts)
        assert set(verdicts.values()) == {1}  # and nothing twice
        port = json.loads((daemon_data / "daemon.json").read_text())["port"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=10) as response:
            status = json.loads(response.read())
        assert status["testers"] == address and status["sent_to_testers"] >= len(drafts)
        assert _evaluator_children(daemon.pid) == []  # the daemon judged nothing itself
    finally:
        stop_all(procs)
