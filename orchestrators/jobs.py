"""The daemon's job queue, kept in the store's database so that it outlives any one daemon process.

Anything may submit (the CLI, the HTTP API, another machine sharing the store); daemons claim jobs in
priority order under leases (``orchestrators.claims``), so a job left ``running`` by a daemon that died
is taken over by another once its lease runs out.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

import sqlalchemy as sa
from pydantic import BaseModel, Field

from maxkernel.messages import new_id
from orchestrators.auto import AutoBudget
from orchestrators.tables import ensure, jobs, utcnow, writing

JobStatus = Literal["queued", "running", "cancelling", "done", "failed", "cancelled"]
ACTIVE = ("queued", "running", "cancelling")


class JobSpec(BaseModel):
    """What a client submits."""

    task: str
    priority: int = 0
    budget: AutoBudget = Field(default_factory=AutoBudget)
    brain: str = "rules"
    target: str = "cpu"


class JobInfo(BaseModel):
    id: str
    task_id: str
    priority: int
    status: JobStatus
    budget: AutoBudget
    brain: str
    target: str
    session_id: str | None = None
    sessions: list[str] = Field(default_factory=list)
    result: dict[str, Any] | None = None
    error: str | None = None
    attempts: int = 0
    owner: str | None = None
    lease_until: datetime | None = None
    created_at: datetime
    updated_at: datetime


class UnknownJob(LookupError):
    """No job with that id (or prefix)."""


def _info(row: Any) -> JobInfo:
    data = dict(row._mapping)
    return JobInfo.model_validate(data | {"sessions": data.get("sessions") or []})


class JobQueue:
    def __init__(self, engine: sa.Engine) -> None:
        ensure(engine)
        self.engine = engine
        self.writer = writing(engine)

    def submit(self, spec: JobSpec) -> JobInfo:
        job_id = new_id()
        now = utcnow()
        with self.writer.begin() as conn:
            conn.execute(jobs.insert().values(
                id=job_id, task_id=spec.task, priority=spec.priority, budget=spec.budget.model_dump(),
                brain=spec.brain, target=spec.target, status="queued", sessions=[], attempts=0,
                created_at=now, updated_at=now))
        return self.get(job_id)

    def resolve(self, prefix: str) -> str:
        with self.engine.connect() as conn:
            ids = conn.execute(sa.select(jobs.c.id).where(jobs.c.id.like(f"{prefix}%")).limit(2)).scalars().all()
        if len(ids) != 1:
            raise UnknownJob(f"no job {prefix!r}" if not ids else f"job id {prefix!r} is ambiguous")
        return ids[0]

    def get(self, job_id: str) -> JobInfo:
        job_id = self.resolve(job_id)
        with self.engine.connect() as conn:
            return _info(conn.execute(sa.select(jobs).where(jobs.c.id == job_id)).one())

    def list(self, status: str | None = None, limit: int = 200) -> list[JobInfo]:
        query = sa.select(jobs).order_by(jobs.c.created_at.desc()).limit(limit)
        if status:
            query = query.where(jobs.c.status == status)
        with self.engine.connect() as conn:
            return [_info(r) for r in conn.execute(query)]

    def started(self, job_id: str, session_id: str) -> None:
        with self.writer.begin() as conn:
            sessions = conn.execute(sa.select(jobs.c.sessions).where(jobs.c.id == job_id)).scalar_one() or []
            conn.execute(jobs.update().where(jobs.c.id == job_id).values(
                session_id=session_id, sessions=[*sessions, session_id], updated_at=utcnow()))

    def cancel(self, job_id: str) -> JobInfo:
        job_id = self.resolve(job_id)
        with self.writer.begin() as conn:
            conn.execute(jobs.update().where(jobs.c.id == job_id, jobs.c.status == "queued")
                         .values(status="cancelled", updated_at=utcnow()))
            conn.execute(jobs.update().where(jobs.c.id == job_id, jobs.c.status == "running")
                         .values(status="cancelling", updated_at=utcnow()))
        return self.get(job_id)

    def wanted_cancelled(self) -> set[str]:
        with self.engine.connect() as conn:
            return set(conn.execute(sa.select(jobs.c.id).where(jobs.c.status == "cancelling")).scalars())

    def counts(self) -> dict[str, int]:
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(jobs.c.status, sa.func.count()).group_by(jobs.c.status)).all()
        return {status: n for status, n in rows}
