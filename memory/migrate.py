"""Bringing a store's schema up to this code's Alembic head, or refusing a newer one.

Runs in one write transaction (``BEGIN IMMEDIATE`` on SQLite, an advisory lock on PostgreSQL), so
two processes opening a fresh store at once migrate it once; the second finds it at head.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError

from memory.engine import WRITE
from memory.errors import SchemaTooNewError

SCRIPT_LOCATION = str(Path(__file__).resolve().parent / "migrations")
# Arbitrary constant: the key of the PostgreSQL advisory lock held while migrating.
_PG_LOCK_KEY = 0x4D4B4D454D  # "MKMEM"


def _config(connection: sa.Connection | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", SCRIPT_LOCATION)
    cfg.set_main_option("path_separator", "os")
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


@lru_cache(maxsize=1)
def code_head() -> str:
    """The newest revision this code knows."""
    head = ScriptDirectory.from_config(_config()).get_current_head()
    assert head is not None, "memory/migrations has no revisions"
    return head


def _known(revision: str) -> bool:
    try:
        return ScriptDirectory.from_config(_config()).get_revision(revision) is not None
    except CommandError:
        return False


def check_revision(revisions: tuple[str, ...], where: str) -> None:
    """Refuse a store whose revision this code does not know (it was migrated by a newer version)."""
    head = code_head()
    for revision in revisions:
        if _known(revision):
            continue
        if revision.isdigit() and head.isdigit() and int(revision) > int(head):
            raise SchemaTooNewError(
                f"store schema revision {revision} is newer than this MaxKernel's {head}: {where}; "
                "upgrade MaxKernel to use it (the store was left untouched)"
            )
        raise SchemaTooNewError(
            f"store schema revision {revision!r} is unknown to this MaxKernel (head {head}): {where}; "
            "it was written by a newer or different version (the store was left untouched)"
        )


def current_revision(connection: sa.Connection) -> str | None:
    heads = MigrationContext.configure(connection).get_current_heads()
    return heads[0] if heads else None


def upgrade(engine: sa.Engine, where: str) -> str:
    """Migrate the store to head; return its revision."""
    with engine.execution_options(**{WRITE: True}).begin() as connection:
        if connection.dialect.name == "postgresql":
            connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_PG_LOCK_KEY})")
        heads = MigrationContext.configure(connection).get_current_heads()
        check_revision(tuple(heads), where)
        if tuple(heads) != (code_head(),):
            command.upgrade(_config(connection), "head")
    return code_head()
