"""The store's Alembic history from its first schema to its last, on SQLite and PostgreSQL, with rows
written at the first revision and the orchestrators' tables as an older MaxKernel created them."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from memory.engine import WRITE
from memory.migrate import _config, code_head, current_revision
from memory.schema import Base
from memory.store import Store

NOW = datetime(2026, 1, 2, tzinfo=UTC)


def _legacy_tables() -> sa.MetaData:
    """The orchestrators' tables as they were created outside Alembic, before leases existed."""
    metadata = sa.MetaData()
    sa.Table("orch_jobs", metadata,
             sa.Column("id", sa.String(64), primary_key=True), sa.Column("task_id", sa.String(200), nullable=False),
             sa.Column("priority", sa.Integer, nullable=False), sa.Column("budget", sa.JSON, nullable=False),
             sa.Column("brain", sa.String(64), nullable=False), sa.Column("target", sa.String(64), nullable=False),
             sa.Column("status", sa.String(32), nullable=False, index=True), sa.Column("session_id", sa.String(64)),
             sa.Column("sessions", sa.JSON, nullable=False), sa.Column("result", sa.JSON), sa.Column("error", sa.Text),
             sa.Column("attempts", sa.Integer, nullable=False),
             sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
             sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False))
    sa.Table("orch_searches", metadata,
             sa.Column("id", sa.String(64), primary_key=True), sa.Column("task_id", sa.String(200), nullable=False),
             sa.Column("algorithm", sa.String(32), nullable=False), sa.Column("config", sa.JSON, nullable=False),
             sa.Column("status", sa.String(32), nullable=False),
             sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
             sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False))
    sa.Table("orch_expansions", metadata,
             sa.Column("search_id", sa.String(64), primary_key=True), sa.Column("n", sa.Integer, primary_key=True),
             sa.Column("round", sa.Integer, nullable=False),
             sa.Column("session_id", sa.String(64), nullable=False, unique=True), sa.Column("parent_id", sa.String(64)),
             sa.Column("strategy", sa.String(200), nullable=False), sa.Column("params", sa.JSON, nullable=False),
             sa.Column("edge", sa.String(300), nullable=False), sa.Column("lane", sa.Integer, nullable=False),
             sa.Column("status", sa.String(32), nullable=False),
             sa.Column("created_at", sa.DateTime(timezone=True), nullable=False))
    return metadata


def _at_first_revision(url: str, *, legacy: bool) -> None:
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    engine = sa.create_engine(url)
    with engine.execution_options(**{WRITE: True}).begin() as conn:
        command.upgrade(_config(conn), "0001")
        conn.execute(sa.text("INSERT INTO tasks (id, name, source_digest, created_at, updated_at) "
                             "VALUES ('t1', 't1', 'd', :now, :now)"), {"now": NOW})
        conn.execute(sa.text("INSERT INTO notes (id, task_id, outcome, pattern, text, created_at) "
                             "VALUES ('n1', 't1', 'worked', '', 'tile by 128', :now)"), {"now": NOW})
        if legacy:
            metadata = _legacy_tables()
            metadata.create_all(conn)
            conn.execute(metadata.tables["orch_jobs"].insert().values(
                id="j1", task_id="t1", priority=0, budget={"max_evaluations": 3}, brain="rules", target="cpu",
                status="running", sessions=["s1"], attempts=1, created_at=NOW, updated_at=NOW))
            conn.execute(metadata.tables["orch_expansions"].insert().values(
                search_id="x", n=0, round=0, session_id="s1", strategy="root", params={"a": 1}, edge="",
                lane=0, status="done", created_at=NOW))
    engine.dispose()


def _check_head(url: str, *, legacy: bool) -> None:
    with Store.open(url) as store:
        assert store.revision == code_head()
        with store.engine.connect() as conn:
            assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
            assert conn.execute(sa.text("SELECT text FROM notes WHERE id = 'n1'")).scalar_one() == "tile by 128"
            jobs = conn.execute(sa.text("SELECT id, status, owner, lease_until FROM orch_jobs")).all()
            assert [tuple(r) for r in jobs] == ([("j1", "running", None, None)] if legacy else [])
            assert conn.execute(sa.text("SELECT count(*) FROM ledger")).scalar_one() == 0
        from orchestrators.jobs import JobQueue

        queue = JobQueue(store.engine)
        if legacy:  # the old row reads back through today's model, JSON included
            job = queue.get("j1")
            assert (job.budget.max_evaluations, job.sessions, job.owner) == (3, ["s1"], None)


def test_first_schema_to_last_keeps_rows_and_adopts_the_old_orchestrator_tables(store_url: str) -> None:
    _at_first_revision(store_url, legacy=True)
    _check_head(store_url, legacy=True)


def test_first_schema_to_last_and_back(store_url: str) -> None:
    _at_first_revision(store_url, legacy=False)
    _check_head(store_url, legacy=False)
    engine = sa.create_engine(store_url)
    with engine.execution_options(**{WRITE: True}).begin() as conn:
        command.downgrade(_config(conn), "0001")
        assert current_revision(conn) == "0001"
        assert not {"orch_jobs", "ledger"} & set(sa.inspect(conn).get_table_names())
    engine.dispose()
