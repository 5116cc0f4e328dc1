"""Creating the SQLAlchemy engine of the store, and turning driver errors into memory errors.

SQLite runs in WAL mode (readers never block the writer) with a busy timeout, and write
transactions start with ``BEGIN IMMEDIATE``: two processes that write at once queue for the lock
instead of failing halfway through a transaction. PostgreSQL needs none of this.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL, Engine, make_url

from memory.errors import (
    MemoryStoreError,
    StoreCorruptError,
    StoreLockedError,
    StoreUnreachableError,
    one_line,
)

# Execution option that marks a connection as a writer (BEGIN IMMEDIATE on SQLite).
WRITE = "maxkernel_write"


def describe(url: URL) -> str:
    """Where the store is, for messages: the file of a SQLite store, the URL (no password) otherwise."""
    if url.get_backend_name() == "sqlite":
        return str(url.database or ":memory:")
    return url.render_as_string(hide_password=True)


def parse_url(url: str) -> URL:
    try:
        return make_url(url)
    except sa.exc.ArgumentError as exc:
        raise StoreUnreachableError(f"invalid store URL {url!r}: {exc}") from exc


def create_store_engine(url: URL, *, busy_timeout_s: float, connect_timeout_s: float) -> Engine:
    """An engine for ``url``; nothing is connected yet."""
    backend = url.get_backend_name()
    try:
        if backend == "sqlite":
            return _sqlite_engine(url, busy_timeout_s)
        if backend == "postgresql":
            return sa.create_engine(
                url,
                connect_args={"connect_timeout": max(1, round(connect_timeout_s))},
                pool_pre_ping=True,
            )
        return sa.create_engine(url)
    except (ImportError, sa.exc.ArgumentError, sa.exc.NoSuchModuleError) as exc:
        raise StoreUnreachableError(f"cannot use store URL {describe(url)}: {exc}") from exc


def _sqlite_engine(url: URL, busy_timeout_s: float) -> Engine:
    database = url.database or ""
    if database and database != ":memory:" and not database.startswith("file:"):
        folder = Path(database).expanduser().parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreUnreachableError(f"cannot create the store's folder {folder}: {exc}") from exc
    engine = sa.create_engine(url, connect_args={"timeout": busy_timeout_s})
    busy_ms = int(busy_timeout_s * 1000)

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event, not the sqlite3 module, decide how transactions start.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {busy_ms}")
            cursor.execute("PRAGMA foreign_keys = ON")
            _enter_wal(cursor, busy_timeout_s)
        finally:
            cursor.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(connection: sa.Connection) -> None:
        immediate = connection.get_execution_options().get(WRITE, False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


def _enter_wal(cursor: Any, busy_timeout_s: float) -> None:
    """Switch a file to WAL once; retry while another process holds the lock.

    Changing the journal mode needs an exclusive lock, and SQLite reports BUSY at once (without
    calling the busy handler) when two fresh connections race for it, so the wait is done here.
    """
    deadline = time.monotonic() + busy_timeout_s
    delay = 0.005
    while True:
        try:
            mode = cursor.execute("PRAGMA journal_mode").fetchone()
            if mode is None or str(mode[0]).lower() in ("wal", "memory"):
                return
            cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc).lower() or time.monotonic() >= deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.1)


_LOCKED = ("database is locked", "database table is locked", "database schema is locked")
_CORRUPT = ("file is not a database", "malformed", "disk image", "file is encrypted")
_UNOPENABLE = ("unable to open database", "readonly database", "disk i/o error")


def translate(exc: BaseException, where: str, doing: str = "") -> MemoryStoreError:
    """The memory error for a driver error raised while ``doing`` something with the store."""
    orig = getattr(exc, "orig", None) or exc
    detail = one_line(orig)
    lower = detail.lower()
    action = f" while {doing}" if doing else ""
    if any(s in lower for s in _LOCKED):
        return StoreLockedError(f"store is locked by another process{action}: {where} ({detail})")
    if any(s in lower for s in _CORRUPT):
        return StoreCorruptError(
            f"store file is corrupt or not a SQLite database: {where} ({detail}); it was left untouched"
        )
    if any(s in lower for s in _UNOPENABLE):
        return StoreUnreachableError(f"cannot open the store{action}: {where} ({detail})")
    from_server = not type(orig).__module__.startswith("sqlite3")
    if from_server and (
        isinstance(exc, (sa.exc.OperationalError, sa.exc.InterfaceError))
        or type(orig).__name__ in ("OperationalError", "ConnectionTimeout")
    ):
        return StoreUnreachableError(f"cannot reach the store{action}: {where} ({detail})")
    return MemoryStoreError(f"store error{action}: {where} ({type(orig).__name__}: {detail})")
