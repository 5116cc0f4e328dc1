"""Many daemons on one queue: a job is claimed by one of them, and taken over when its lease ends."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections import Counter

import sqlalchemy as sa
from memory.store import Store
from orchestrators.claims import Claimer
from orchestrators.jobs import JobQueue, JobSpec


def _queue(url: str) -> tuple[Store, JobQueue]:
    store = Store.open(url)
    return store, JobQueue(store.engine)


def test_two_daemons_on_one_postgresql_never_claim_the_same_job(pg_url: str) -> None:
    stores = [Store.open(pg_url) for _ in range(2)]
    try:
        queues = [JobQueue(s.engine) for s in stores]
        submitted = {queues[0].submit(JobSpec(task=f"t{i}", priority=i % 3)).id for i in range(40)}
        claimed: list[tuple[str, str]] = []
        lock = threading.Lock()
        barrier = threading.Barrier(4)

        def daemon(queue: JobQueue, name: str) -> None:
            claimer = Claimer(queue, owner=name, lease_s=60)
            barrier.wait()
            while (job := claimer.claim()) is not None:
                with lock:
                    claimed.append((job.id, name))
                assert claimer.finish(job.id, "done", {"by": name})

        threads = [threading.Thread(target=daemon, args=(queues[i % 2], f"d{i}")) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        counts = Counter(job_id for job_id, _ in claimed)
        assert set(counts) == submitted and set(counts.values()) == {1}
        assert len({name for _, name in claimed}) > 1  # the work was shared, not serialised on one daemon
        for job in queues[1].list(limit=100):
            assert job.status == "done" and job.attempts == 1 and job.result == {"by": job.owner}
    finally:
        for s in stores:
            s.close()


def test_a_job_whose_lease_ran_out_is_taken_over_and_its_old_owner_fenced_off(store_url: str) -> None:
    store, queue = _queue(store_url)
    try:
        job = queue.submit(JobSpec(task="t_lease"))
        dead = Claimer(queue, owner="dead", lease_s=0.4)
        live = Claimer(queue, owner="live", lease_s=30)
        assert dead.claim().id == job.id
        assert live.claim() is None  # the lease still holds
        assert dead.renew({job.id}) == set()
        time.sleep(0.6)
        taken = live.claim()
        assert taken is not None and taken.id == job.id and taken.owner == "live" and taken.attempts == 2
        assert dead.renew({job.id}) == {job.id}  # the old owner learns it lost the job
        assert not dead.finish(job.id, "failed", None, "late")
        assert queue.get(job.id).status == "running"
        assert live.finish(job.id, "done", {"ok": True})
        got = queue.get(job.id)
        assert (got.status, got.owner, got.result, got.lease_until) == ("done", "live", {"ok": True}, None)
    finally:
        store.close()


def test_release_requeues_and_a_cancel_on_a_dead_daemons_job_ends_it(store_url: str) -> None:
    store, queue = _queue(store_url)
    try:
        a, b = queue.submit(JobSpec(task="a", priority=1)), queue.submit(JobSpec(task="b"))
        first = Claimer(queue, owner="one", lease_s=0.3)
        assert first.claim().id == a.id and first.claim().id == b.id
        first.release(a.id)
        assert queue.get(a.id).status == "queued" and queue.get(a.id).owner is None
        queue.cancel(b.id)
        time.sleep(0.5)
        other = Claimer(queue, owner="two", lease_s=30)
        assert other.claim().id == a.id
        assert other.claim() is None  # b was being cancelled when its daemon went: it ends cancelled
        assert queue.get(b.id).status == "cancelled"
        with store.engine.connect() as conn:
            assert conn.execute(sa.select(sa.func.count()).select_from(sa.table("orch_jobs"))).scalar_one() == 2
    finally:
        store.close()


def test_a_dead_local_daemons_jobs_are_claimable_at_once(store_url: str) -> None:
    store, queue = _queue(store_url)
    try:
        job = queue.submit(JobSpec(task="t_dead"))
        gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
        host = socket.gethostname()[:30]
        dead = Claimer(queue, owner=f"{host}:{gone.stdout.strip()}:abc", lease_s=600)
        alive = Claimer(queue, owner=f"{host}:{os.getpid()}:def", lease_s=600)
        assert dead.claim().id == job.id
        assert list(alive.expire_dead_here()) == [job.id]
        assert alive.claim().id == job.id and queue.get(job.id).owner == alive.owner
        assert list(alive.expire_dead_here()) == []  # a live owner keeps its lease
    finally:
        store.close()


def test_a_daemon_that_died_unreaped_counts_as_dead(store_url: str) -> None:
    """A killed daemon whose parent has not reaped it yet (a zombie) no longer holds its jobs."""
    store, queue = _queue(store_url)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        job = queue.submit(JobSpec(task="t_zombie"))
        deadline = time.monotonic() + 30
        while open(f"/proc/{child.pid}/stat").read().rpartition(")")[2].split()[0] != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        host = socket.gethostname()[:30]
        dead = Claimer(queue, owner=f"{host}:{child.pid}:abc", lease_s=600)
        alive = Claimer(queue, owner=f"{host}:{os.getpid()}:def", lease_s=600)
        assert dead.claim().id == job.id
        assert list(alive.expire_dead_here()) == [job.id]
    finally:
        child.wait()
        store.close()


def test_a_job_to_take_over_goes_before_an_older_queued_one(store_url: str) -> None:
    store, queue = _queue(store_url)
    try:
        older, orphan = queue.submit(JobSpec(task="t_older")), queue.submit(JobSpec(task="t_orphan"))
        host = socket.gethostname()[:30]
        gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
        dead = Claimer(queue, owner=f"{host}:{gone.stdout.strip()}:abc", lease_s=600)
        alive = Claimer(queue, owner=f"{host}:{os.getpid()}:def", lease_s=600)
        assert dead.claim().id == older.id and dead.claim().id == orphan.id
        dead.release(older.id)  # queued again; the orphan stays with the dead daemon
        assert list(alive.expire_dead_here()) == [orphan.id]
        assert list(alive.expire_dead_here()) == []  # its lease is ended once
        assert alive.claim().id == orphan.id  # work done waits in it: before the older queued job
        assert alive.claim().id == older.id
    finally:
        store.close()
