"""A daemon that sees a daemon of its host die makes that daemon's jobs claimable within a second, and
its next free slot takes them over before older queued jobs; it never runs beyond its concurrency."""

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


def test_a_dead_daemons_job_is_taken_over_by_the_next_free_slot(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'jobs.db'}")
    try:
        queue = JobQueue(store.engine)
        own, waiting, orphan = (queue.submit(JobSpec(task=name)) for name in ("t_own", "t_waiting", "t_orphan"))
        host = socket.gethostname()[:30]
        gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
        daemon = Daemon(load_settings(data_dir=str(tmp_path)), concurrency=1, lease_s=600)
        daemon.queue = queue
        daemon.claims = Claimer(queue, owner=f"{host}:{os.getpid()}:def", lease_s=600)
        dead = Claimer(queue, owner=f"{host}:{gone.stdout.strip()}:abc", lease_s=600)
        ran: list[str] = []

        async def run_job(job: JobInfo) -> None:
            ran.append(job.task_id)
            await asyncio.sleep(30)

        daemon.run_job = run_job  # type: ignore[method-assign]

        async def scenario() -> None:
            await daemon._fill()  # its own job, the oldest
            for _ in range(2):  # the dead daemon had claimed the other two; one went back to the queue
                dead.claim()
            dead.release(waiting.id)
            assert queue.get(orphan.id).lease_until is not None
            await daemon._look_for_dead()
            assert queue.get(orphan.id).lease_until is None  # claimable now, its lease not waited out
            await daemon._fill()
            assert set(daemon.running) == {own.id}  # full: nothing beyond its concurrency
            daemon.running.pop(own.id).cancel()
            await daemon._fill()
            assert set(daemon.running) == {orphan.id}  # the free slot takes the orphan before the older job
            await asyncio.sleep(0.05)  # it starts
            for task in daemon.running.values():
                task.cancel()
            await asyncio.sleep(0)

        asyncio.run(scenario())
        assert ran == ["t_own", "t_orphan"]
        assert queue.get(orphan.id).owner == daemon.claims.owner and queue.get(orphan.id).attempts == 2
        assert queue.get(waiting.id).status == "queued"
    finally:
        store.close()


# A daemon's memory write cut by SIGKILL between Chroma taking the note's vector and SQL committing the note.
DIES_WRITING = """
import os, signal, sys
from maxkernel.config import Settings
from memory import Memory
from memory.vectors import VectorMemory

real = VectorMemory.upsert
def upsert_then_die(self, *args, **kwargs):
    real(self, *args, **kwargs)
    os.kill(os.getpid(), signal.SIGKILL)
VectorMemory.upsert = upsert_then_die
print(os.getpid(), flush=True)
with Memory.open(Settings(data_dir=sys.argv[1])) as memory:
    memory.remember_note("the dead daemon's last note", outcome="info")
"""


def test_the_vectors_a_dead_daemon_left_without_records_are_forgotten_when_its_job_is_taken_over(tmp_path: Path) -> None:
    from memory import Memory
    from memory.vectors import NOTES

    settings = load_settings(data_dir=str(tmp_path))
    with Memory.open(settings) as memory:
        kept = memory.remember_note("a note that committed", outcome="info")
    child = subprocess.run([sys.executable, "-c", DIES_WRITING, str(tmp_path)], capture_output=True, text=True,
                           timeout=120, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert child.returncode == -9, child.stderr[-2000:]
    host = socket.gethostname()[:30]
    daemon = Daemon(settings, concurrency=1, lease_s=600)
    try:
        daemon.queue = JobQueue(daemon.services("rules").store.engine)
        daemon.claims = Claimer(daemon.queue, owner=f"{host}:{os.getpid()}:def", lease_s=600)
        job = daemon.queue.submit(JobSpec(task="t_orphan"))
        assert Claimer(daemon.queue, owner=f"{host}:{child.stdout.split()[0]}:abc", lease_s=600).claim().id == job.id
        notes = daemon.services("rules").memory.vectors
        assert notes.count(NOTES) == 2  # the committed note's vector and the dead daemon's orphan
        async def look() -> None:
            await daemon._look_for_dead()
            assert daemon._sweeping is not None
            await daemon._sweeping

        asyncio.run(look())
        assert daemon.queue.get(job.id).lease_until is None
        assert notes._collections[NOTES].get(include=[])["ids"] == [kept.id]
        assert daemon.services("rules").memory.store.list_notes()[0].id == kept.id
    finally:
        for services in daemon._services.values():
            asyncio.run(services.aclose())
