"""The SQL tables of the store (SQLAlchemy 2 ORM).

This module describes the *current* schema; the Alembic revisions in ``memory/migrations`` are what
create it. A change here needs a new revision there (a test checks that the two agree).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

# JSONB on PostgreSQL (indexable, compact), plain JSON text elsewhere.
JsonType = JSON().with_variant(JSONB(), "postgresql")
# SQLite only auto-increments an INTEGER PRIMARY KEY (the rowid).
SeqType = BigInteger().with_variant(Integer(), "sqlite")


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC on the way in and out: SQLite keeps no zone, PostgreSQL converts to its own."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def new_id() -> str:
    """Random ids, so that memories exported from two machines never collide on import."""
    return uuid.uuid4().hex


def utcnow() -> datetime:
    return datetime.now(UTC)


# Explicit constraint names, identical on SQLite and PostgreSQL, so that migrations can name them.
NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_name)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {dict[str, Any]: JsonType}


class TaskRow(Base):
    """A task seen by MaxKernel, with its structural signature cached (tracing needs JAX)."""

    __tablename__ = "tasks"
    id: Mapped[str] = mapped_column(String(200), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), default="")
    category: Mapped[str | None] = mapped_column(String(40))
    source_digest: Mapped[str] = mapped_column(String(64), default="")
    signature: Mapped[dict[str, Any] | None] = mapped_column(JsonType)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)


class SessionRow(Base):
    """One HITL, Auto, search or daemon session."""

    __tablename__ = "sessions"
    id: Mapped[str] = mapped_column(String(64), primary_key=True, default=new_id)
    task_id: Mapped[str | None] = mapped_column(String(200), index=True)
    mode: Mapped[str] = mapped_column(String(32))
    brain: Mapped[str] = mapped_column(String(64))
    target: Mapped[str] = mapped_column(String(64))
    budget: Mapped[dict[str, Any]] = mapped_column(JsonType, default=dict)
    status: Mapped[str] = mapped_column(String(32), default="running", index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)


class CandidateRow(Base):
    """A kernel source produced during a session. ``session_id`` and ``parent_id`` are plain pointers,
    not foreign keys: an imported kernel's session and ancestors stay on the machine that made them."""

    __tablename__ = "candidates"
    id: Mapped[str] = mapped_column(String(64), primary_key=True, default=new_id)
    task_id: Mapped[str] = mapped_column(ForeignKey("tasks.id"), index=True)
    session_id: Mapped[str | None] = mapped_column(String(64), index=True)
    parent_id: Mapped[str | None] = mapped_column(String(64), index=True)
    code: Mapped[str] = mapped_column(Text)
    code_sha: Mapped[str] = mapped_column(String(64), index=True)
    strategy: Mapped[str] = mapped_column(String(200), default="")
    produced_by: Mapped[str] = mapped_column(String(200), default="")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class EvaluationRow(Base):
    """One evaluation of a candidate: the full report, plus the columns queries filter on."""

    __tablename__ = "evaluations"
    id: Mapped[str] = mapped_column(String(64), primary_key=True, default=new_id)
    candidate_id: Mapped[str] = mapped_column(ForeignKey("candidates.id"), index=True)
    task_id: Mapped[str] = mapped_column(String(200), index=True)
    target: Mapped[str] = mapped_column(String(64))
    size: Mapped[str] = mapped_column(String(32))
    status: Mapped[str] = mapped_column(String(32), index=True)
    correct: Mapped[bool] = mapped_column(Boolean)
    speedup: Mapped[float | None] = mapped_column(Float)
    kernel_ms: Mapped[float | None] = mapped_column(Float)
    ref_ms: Mapped[float | None] = mapped_column(Float)
    basis: Mapped[str | None] = mapped_column(String(16))
    report: Mapped[dict[str, Any]] = mapped_column(JsonType)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class EventRow(Base):
    """Every bus message, in the order it was recorded. Append-only: triggers refuse UPDATE/DELETE."""

    __tablename__ = "events"
    seq: Mapped[int] = mapped_column(SeqType, primary_key=True, autoincrement=True)
    session_id: Mapped[str | None] = mapped_column(String(64))
    correlation_id: Mapped[str | None] = mapped_column(String(64), index=True)
    message_type: Mapped[str] = mapped_column(String(100), index=True)
    task_id: Mapped[str | None] = mapped_column(String(200))
    candidate_id: Mapped[str | None] = mapped_column(String(64))
    payload: Mapped[dict[str, Any]] = mapped_column(JsonType)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    __table_args__ = (Index("ix_events_session_seq", "session_id", "seq"),)


class KernelRow(Base):
    """A verified kernel remembered for recall; its vector lives in Chroma under the same id."""

    __tablename__ = "kernels"
    id: Mapped[str] = mapped_column(String(64), primary_key=True, default=new_id)
    task_id: Mapped[str] = mapped_column(ForeignKey("tasks.id"), index=True)
    candidate_id: Mapped[str] = mapped_column(ForeignKey("candidates.id"))
    evaluation_id: Mapped[str] = mapped_column(ForeignKey("evaluations.id"))
    target: Mapped[str] = mapped_column(String(64), index=True)
    speedup: Mapped[float | None] = mapped_column(Float)
    strategy: Mapped[str] = mapped_column(String(200), default="")
    code_sha: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)

    __table_args__ = (UniqueConstraint("code_sha", "task_id", "target", name="uq_kernels_code_task_target"),)


class NoteRow(Base):
    """A short optimization lesson: what worked or failed, on which op pattern and target."""

    __tablename__ = "notes"
    id: Mapped[str] = mapped_column(String(64), primary_key=True, default=new_id)
    task_id: Mapped[str | None] = mapped_column(ForeignKey("tasks.id"), index=True)
    session_id: Mapped[str | None] = mapped_column(String(64))
    target: Mapped[str | None] = mapped_column(String(64))
    outcome: Mapped[str] = mapped_column(String(16))
    pattern: Mapped[str] = mapped_column(String(400), default="")
    category: Mapped[str | None] = mapped_column(String(40))
    text: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)


# -- the orchestrators' bookkeeping and the fleet's ledger ---------------------------------------------
# They live in this metadata so that one Alembic history creates every table of the store.


class JobRow(Base):
    """A daemon job. ``owner`` and ``lease_until`` say which daemon runs it and until when that claim
    holds without renewal: a job whose lease ran out belongs to whichever daemon claims it next."""

    __tablename__ = "orch_jobs"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    task_id: Mapped[str] = mapped_column(String(200))
    priority: Mapped[int] = mapped_column(Integer, default=0)
    budget: Mapped[dict[str, Any]] = mapped_column(JsonType)
    brain: Mapped[str] = mapped_column(String(64), default="rules")
    target: Mapped[str] = mapped_column(String(64), default="cpu")
    status: Mapped[str] = mapped_column(String(32), index=True)
    session_id: Mapped[str | None] = mapped_column(String(64))
    sessions: Mapped[list[str]] = mapped_column(JsonType, default=list)
    result: Mapped[dict[str, Any] | None] = mapped_column(JsonType)
    error: Mapped[str | None] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    owner: Mapped[str | None] = mapped_column(String(64))
    lease_until: Mapped[datetime | None] = mapped_column(UTCDateTime)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)


class SearchRow(Base):
    """A resumable search over a graph of candidates."""

    __tablename__ = "orch_searches"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    task_id: Mapped[str] = mapped_column(String(200))
    algorithm: Mapped[str] = mapped_column(String(32))
    config: Mapped[dict[str, Any]] = mapped_column(JsonType)
    status: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)


class ExpansionRow(Base):
    """One expansion of a search: the session that grew a node of its graph."""

    __tablename__ = "orch_expansions"
    search_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    n: Mapped[int] = mapped_column(Integer, primary_key=True)
    round: Mapped[int] = mapped_column(Integer)
    session_id: Mapped[str] = mapped_column(String(64), unique=True)
    parent_id: Mapped[str | None] = mapped_column(String(64))
    strategy: Mapped[str] = mapped_column(String(200))
    params: Mapped[dict[str, Any]] = mapped_column(JsonType)
    edge: Mapped[str] = mapped_column(String(300))
    lane: Mapped[int] = mapped_column(Integer, default=0)
    status: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class LedgerRow(Base):
    """Tokens and cost of one model call, booked by whichever process made it: the sum over the table
    is what a budget shared by the whole fleet is checked against."""

    __tablename__ = "ledger"
    seq: Mapped[int] = mapped_column(SeqType, primary_key=True, autoincrement=True)
    scope: Mapped[str] = mapped_column(String(200), index=True)
    process: Mapped[str] = mapped_column(String(200), default="")
    model: Mapped[str] = mapped_column(String(200), default="")
    tokens_in: Mapped[int] = mapped_column(Integer, default=0)
    tokens_out: Mapped[int] = mapped_column(Integer, default=0)
    cost_usd: Mapped[float] = mapped_column(Float, default=0.0)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
