"""The daemon's job queue, kept in the store's database so that it outlives any one daemon process.

Anything may submit (the CLI, the HTTP API, another machine sharing the store); daemons claim jobs in
priority order under leases (``orchestrators.claims``), so a job left ``running`` by a daemon that died
is taken over by another once its lease runs out.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, get_args

import sqlalchemy as sa
from pydantic import BaseModel, Field, field_validator

from maxkernel.messages import new_id
from memory.engine import describe
from memory.errors import RecordNotFoundError
from memory.ids import resolve_prefix
from orchestrators.auto import AutoBudget
from orchestrators.tables import ensure, jobs, utcnow, writing

JobStatus = Literal["queued", "running", "cancelling", "done", "failed", "cancelled"]
STATUSES: tuple[str, ...] = get_args(JobStatus)
ACTIVE = ("queued", "running", "cancelling")


class JobSpec(BaseModel):
    """What a client submits."""

    task: str
    priority: int = 0
    budget: AutoBudget = Field(default_factory=AutoBudget)
    brain: str = "rules"
    target: str = "cpu"

    @field_validator("budget", mode="before")
    @classmethod
    def _positive_limits(cls, value: Any) -> Any:
        """A non-positive limit is refused in the CLI's words, whichever door (CLI, HTTP API, form) it came by."""
        if isinstance(value, dict):
            for key, flag, floor in (("time_s", "--budget", 0.0), ("max_evaluations", "--evals", 0.0)):
                raw = value.get(key)
                try:
                    number = float(raw) if raw is not None else None
                except (TypeError, ValueError):
                    continue  # not a number: the model's own check names it
                if number is not None and number <= floor:
                    raise ValueError(f"{flag} {raw}: must be positive")
        return value


DAEMON_BRAINS = ("rules", "gemini", "openai")


class BadJob(ValueError):
    """A job spec that cannot run (unknown task, target or brain, no budget); one line, the CLI's words."""


def check_spec(spec: JobSpec) -> JobSpec:
    """Refuse a spec the daemon could never run, at the door; a task folder is kept as its full path."""
    from pathlib import Path

    from jaxbench.task import TaskError, check_own_id, load_task
    from maxkernel.analysis.signature import SignatureError, check_reference
    from maxkernel.targets.names import TargetError, parse_target

    if spec.brain not in DAEMON_BRAINS:
        raise BadJob(f"--brain {spec.brain}: the daemon runs {', '.join(DAEMON_BRAINS[:-1])} or {DAEMON_BRAINS[-1]}")
    time_s, evals = spec.budget.time_s, spec.budget.max_evaluations
    if (time_s is not None and time_s <= 0) or (evals is not None and evals < 1):
        raise BadJob("--budget and --evals must be positive")
    try:
        kind, chip = parse_target(spec.target)
        if kind == "gpu" and chip is not None:
            from maxkernel.targets.gpu_lowering import require_plugin

            require_plugin(spec.target)
        loaded = load_task(spec.task)
        check_own_id(loaded)
        check_reference(loaded)  # a reference that does not import or trace is refused here, not by a run
    except (TaskError, TargetError, SignatureError) as exc:
        raise BadJob(str(exc)) from exc
    ref = str(Path(spec.task).resolve()) if Path(spec.task).exists() else loaded.id
    return spec.model_copy(update={"task": ref})


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


class JobNotActive(ValueError):
    """A cancel asked of a job that already ended: nothing was cancelled."""


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
        """The full id of the job whose id is ``prefix`` or starts with it (the one id rule)."""
        try:
            with self.engine.connect() as conn:
                return resolve_prefix(conn, [("job", jobs.c.id)], prefix, describe(self.engine.url))[1]
        except RecordNotFoundError as exc:
            raise UnknownJob(str(exc)) from exc

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
        """Cancel a queued job now, or ask a running one to stop; a job that already ended is refused."""
        job_id = self.resolve(job_id)
        with self.writer.begin() as conn:
            status = conn.execute(sa.select(jobs.c.status).where(jobs.c.id == job_id)).scalar_one()
            if status not in ACTIVE:
                raise JobNotActive(f"job {job_id} is already {status}; nothing to cancel")
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
