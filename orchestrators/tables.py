"""The orchestrators' own tables (jobs, searches, expansions), in the store's database.

``memory.Store`` has no table for daemon jobs or search bookkeeping, and its Alembic history belongs to
the memory package, so these live beside it as plain SQLAlchemy Core tables created if missing. They
only *point at* the store's sessions and candidates; the event log stays the record of what happened.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

metadata = sa.MetaData()


def utcnow() -> datetime:
    return datetime.now(UTC)


jobs = sa.Table(
    "orch_jobs", metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("task_id", sa.String(200), nullable=False),
    sa.Column("priority", sa.Integer, nullable=False, default=0),
    sa.Column("budget", sa.JSON, nullable=False),
    sa.Column("brain", sa.String(64), nullable=False, default="rules"),
    sa.Column("target", sa.String(64), nullable=False, default="cpu"),
    sa.Column("status", sa.String(32), nullable=False, index=True),
    sa.Column("session_id", sa.String(64)),
    sa.Column("sessions", sa.JSON, nullable=False, default=list),
    sa.Column("result", sa.JSON),
    sa.Column("error", sa.Text),
    sa.Column("attempts", sa.Integer, nullable=False, default=0),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, default=utcnow),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, default=utcnow, onupdate=utcnow),
)

searches = sa.Table(
    "orch_searches", metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("task_id", sa.String(200), nullable=False),
    sa.Column("algorithm", sa.String(32), nullable=False),
    sa.Column("config", sa.JSON, nullable=False),
    sa.Column("status", sa.String(32), nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, default=utcnow),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, default=utcnow, onupdate=utcnow),
)

expansions = sa.Table(
    "orch_expansions", metadata,
    sa.Column("search_id", sa.String(64), primary_key=True),
    sa.Column("n", sa.Integer, primary_key=True),
    sa.Column("round", sa.Integer, nullable=False),
    sa.Column("session_id", sa.String(64), nullable=False, unique=True),
    sa.Column("parent_id", sa.String(64)),
    sa.Column("strategy", sa.String(200), nullable=False),
    sa.Column("params", sa.JSON, nullable=False),
    sa.Column("edge", sa.String(300), nullable=False),
    sa.Column("lane", sa.Integer, nullable=False, default=0),
    sa.Column("status", sa.String(32), nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, default=utcnow),
)

_ready: set[int] = set()


def ensure(engine: sa.Engine) -> None:
    """Create the tables that are missing (idempotent; safe from several processes)."""
    if id(engine) in _ready:
        return
    try:
        metadata.create_all(engine, checkfirst=True)
    except sa.exc.OperationalError as exc:  # another process created them between check and create
        if "already exists" not in str(exc):
            raise
    _ready.add(id(engine))


def writing(engine: sa.Engine) -> sa.Engine:
    """The engine marked as a writer (``BEGIN IMMEDIATE`` on SQLite, so writers queue instead of failing)."""
    from memory.engine import WRITE

    return engine.execution_options(**{WRITE: True})


def resolve_id(store: Any, prefix: str, kinds: tuple[str, ...] = ("job", "search", "session")) -> tuple[str, str]:
    """``(kind, full id)`` for a job, search or session id, or any unique prefix of one (the one id rule)."""
    from memory.ids import resolve_prefix
    from memory.schema import SessionRow

    ensure(store.engine)
    columns = {"job": jobs.c.id, "search": searches.c.id, "session": SessionRow.__table__.c.id}
    with store.engine.connect() as conn:
        return resolve_prefix(conn, [(k, columns[k]) for k in kinds], prefix, store.where)
