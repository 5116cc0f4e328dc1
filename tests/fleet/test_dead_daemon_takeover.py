"""A daemon that sees a daemon of its host die takes that daemon's jobs over at once, even when it is
already running as many jobs as its concurrency, and takes no other job beyond it."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from pathlib import Path

from maxkernel.config import load_settings
from memory.store import Store
from orchestrators.claims import Claimer
from orchestrators.daemon import Daemon
from orchestrators.jobs import JobInfo, JobQueue, JobSpec


def test_a_dead_daemons_jobs_are_taken_over_beyond_concurrency(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'jobs.db'}")
    try:
        queue = JobQueue(store.engine)
        own, orphan, waiting = (queue.submit(JobSpec(task=name)) for name in ("t_own", "t_orphan", "t_waiting"))
        gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
        dead = Claimer(queue, owner=f"{socket.gethostname()[:30]}:{gone.stdout.strip()}:abc", lease_s=600)
        assert dead.claim(among=[orphan.id]).id == orphan.id  # held by a daemon that has died since

        daemon = Daemon(load_settings(data_dir=str(tmp_path)), concurrency=1, lease_s=600)
        daemon.queue = queue
        daemon.claims = Claimer(queue, owner=f"{socket.gethostname()[:30]}:{os.getpid()}:def", lease_s=600)
        ran: list[str] = []

        async def run_job(job: JobInfo) -> None:
            ran.append(job.task_id)
            await asyncio.sleep(30)

        daemon.run_job = run_job  # type: ignore[method-assign]

        async def scenario() -> None:
            assert daemon.claims.claim(among=[own.id]).id == own.id
            daemon.running[own.id] = asyncio.create_task(run_job(queue.get(own.id)))  # at its concurrency
            await daemon._take_over_dead()
            await asyncio.sleep(0.1)
            assert set(daemon.running) == {own.id, orphan.id}
            for task in daemon.running.values():
                task.cancel()

        asyncio.run(scenario())
        assert ran == ["t_own", "t_orphan"]
        assert queue.get(orphan.id).owner == daemon.claims.owner and queue.get(orphan.id).attempts == 2
        assert queue.get(waiting.id).status == "queued"  # no queued job beyond its concurrency
    finally:
        store.close()
