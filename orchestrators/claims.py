"""Jobs claimed by many daemons from one queue: row locks, leases and takeover.

A daemon claims a job by locking its row (``FOR UPDATE SKIP LOCKED`` on PostgreSQL, so concurrent
claimers each get a different row without waiting; SQLite's single writer serialises claims instead)
and writing itself as the owner with a lease. While the job runs the daemon renews the lease; a job
whose lease ran out (its daemon died or hung) is claimable again and is carried on from its event log.
Every later write of the job names its owner, so a daemon that lost its lease can no longer finish it.
A daemon of the same host that died (gone, or exited and not yet reaped) is seen at once from its
process id, and its jobs made claimable without waiting out their leases.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
import structlog

from maxkernel.messages import new_id
from memory.vectors import writer_name
from orchestrators.jobs import JobInfo, JobQueue, JobStatus
from orchestrators.tables import jobs, utcnow

log = structlog.get_logger("orchestrators.claims")

DEFAULT_LEASE_S = 30.0


def owner_name() -> str:
    """A name unique to this process and telling where it runs (host, pid, a random tag): its memory's
    ``writer_name`` and a tag."""
    return f"{writer_name()}:{new_id()[:8]}"


def owner_writer(owner: str) -> str:
    """The memory writer (``host:pid``) of the process that ``owner`` names."""
    return owner.rpartition(":")[0]


def _dead_here(owner: str | None) -> bool:
    """Whether ``owner`` names a process of this host that no longer exists."""
    host, _, rest = (owner or "").partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname()[:30] or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return _zombie(int(pid))


def _zombie(pid: int) -> bool:
    """Whether ``pid`` has exited and waits only to be reaped by its parent (Linux's state ``Z``)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat.rpartition(")")[2].split()
    return bool(fields) and fields[0] == "Z"


class Claimer:
    """One daemon's side of the shared queue: claim, renew, finish and release under its own name."""

    def __init__(self, queue: JobQueue, *, owner: str | None = None, lease_s: float = DEFAULT_LEASE_S) -> None:
        self.queue, self.owner, self.lease_s = queue, owner or owner_name(), lease_s

    def _until(self) -> datetime:
        return utcnow() + timedelta(seconds=self.lease_s)

    def _claimable(self, now: datetime) -> sa.ColumnElement[bool]:
        expired = sa.and_(jobs.c.status.in_(("running", "cancelling")),
                          sa.or_(jobs.c.lease_until.is_(None), jobs.c.lease_until < now))
        return sa.or_(jobs.c.status == "queued", expired)

    def claim(self) -> JobInfo | None:
        """The next job among the queued and those whose lease ran out: highest priority first, within
        it a job to take over before a queued one (it has work done that waits), then the oldest.

        A taken-over job that was being cancelled is cancelled here rather than run again."""
        while True:
            now = utcnow()
            with self.queue.writer.begin() as conn:
                queued_last = sa.case((jobs.c.status == "queued", 1), else_=0)
                query = (sa.select(jobs.c.id, jobs.c.attempts, jobs.c.status, jobs.c.owner)
                         .where(self._claimable(now))
                         .order_by(jobs.c.priority.desc(), queued_last, jobs.c.created_at).limit(1))
                if conn.dialect.name == "postgresql":
                    query = query.with_for_update(skip_locked=True)
                row = conn.execute(query).first()
                if row is None:
                    return None
                if row.status == "cancelling":
                    conn.execute(jobs.update().where(jobs.c.id == row.id).values(
                        status="cancelled", owner=None, lease_until=None, updated_at=now))
                    continue
                conn.execute(jobs.update().where(jobs.c.id == row.id).values(
                    status="running", attempts=row.attempts + 1, owner=self.owner, lease_until=self._until(),
                    updated_at=now))
            if row.status != "queued":
                log.info("claims.takeover", job=row.id, previous_owner=row.owner, owner=self.owner)
            return self.queue.get(row.id)

    def expire_dead_here(self) -> dict[str, str]:
        """End at once the leases of jobs held by dead daemons of this host (no need to wait them out);
        the jobs whose leases it ended, each with its dead owner (those ended already are left as they are)."""
        with self.queue.writer.begin() as conn:
            rows = conn.execute(sa.select(jobs.c.id, jobs.c.owner)
                                .where(jobs.c.status.in_(("running", "cancelling")), jobs.c.lease_until.is_not(None))).all()
            dead = {r.id: r.owner for r in rows if _dead_here(r.owner)}
            if dead:
                conn.execute(jobs.update().where(jobs.c.id.in_(list(dead))).values(lease_until=None))
        if dead:
            log.info("claims.expired_dead_local", jobs=list(dead))
        return dead

    def renew(self, job_ids: set[str] | list[str]) -> set[str]:
        """Extend the leases of ``job_ids``; return those this daemon no longer owns (taken over or ended)."""
        wanted = set(job_ids)
        if not wanted:
            return set()
        with self.queue.writer.begin() as conn:
            kept = set(conn.execute(
                jobs.update().where(jobs.c.id.in_(wanted), jobs.c.owner == self.owner,
                                    jobs.c.status.in_(("running", "cancelling")))
                .values(lease_until=self._until()).returning(jobs.c.id)).scalars())
        return wanted - kept

    def finish(self, job_id: str, status: JobStatus, result: dict[str, Any] | None = None,
               error: str | None = None) -> bool:
        """Record the end of a job this daemon still owns; False (and nothing written) when it does not."""
        with self.queue.writer.begin() as conn:
            done = conn.execute(jobs.update().where(jobs.c.id == job_id, jobs.c.owner == self.owner).values(
                status=status, result=result, error=error, lease_until=None, updated_at=utcnow())).rowcount
        if not done:
            log.warning("claims.finish_refused", job=job_id, owner=self.owner, status=status)
        return bool(done)

    def release(self, job_id: str) -> None:
        """Give an interrupted job back to the queue at once (a cancel asked meanwhile wins)."""
        mine = sa.and_(jobs.c.id == job_id, jobs.c.owner == self.owner)
        with self.queue.writer.begin() as conn:
            conn.execute(jobs.update().where(mine, jobs.c.status == "running")
                         .values(status="queued", owner=None, lease_until=None, updated_at=utcnow()))
            conn.execute(jobs.update().where(mine, jobs.c.status == "cancelling")
                         .values(status="cancelled", owner=None, lease_until=None, updated_at=utcnow()))

    def owners(self) -> dict[str, str]:
        """Running job -> the daemon that holds it (for status displays)."""
        with self.queue.engine.connect() as conn:
            rows = conn.execute(sa.select(jobs.c.id, jobs.c.owner).where(jobs.c.status == "running")).all()
        return {r.id: r.owner or "" for r in rows}
