"""The orchestrators' own tables (jobs, searches, expansions), in the store's database.

They are declared with the store's schema (``memory.schema``), so the store's Alembic history creates
them; here they are the Core tables the orchestrators query. They only *point at* the store's sessions
and candidates; the event log stays the record of what happened.
"""

from __future__ import annotations

import weakref
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from memory.schema import ExpansionRow, JobRow, SearchRow


def utcnow() -> datetime:
    return datetime.now(UTC)


jobs: sa.Table = JobRow.__table__  # type: ignore[assignment]
searches: sa.Table = SearchRow.__table__  # type: ignore[assignment]
expansions: sa.Table = ExpansionRow.__table__  # type: ignore[assignment]

_ready: "weakref.WeakSet[sa.Engine]" = weakref.WeakSet()  # by the engine itself: a freed engine's id() is reused


def ensure(engine: sa.Engine) -> None:
    """Bring the store to the schema these tables need (idempotent; one migration however many callers)."""
    if engine in _ready:
        return
    from memory.migrate import upgrade

    upgrade(engine, engine.url.render_as_string(hide_password=True))
    _ready.add(engine)


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
