"""The orchestrators' tables under Alembic (jobs with leases, searches, expansions) and the ledger.

Stores that an older MaxKernel used already hold ``orch_*`` tables it created outside Alembic: those are
kept with their rows and brought to this schema (lease columns added, JSON made JSONB on PostgreSQL).

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from collections.abc import Callable

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(JSONB(), "postgresql")
SEQ = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
JSON_COLUMNS = {"orch_jobs": ("budget", "sessions", "result"), "orch_searches": ("config",),
                "orch_expansions": ("params",)}


def _ts(name: str, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def _jobs() -> None:
    op.create_table(
        "orch_jobs",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("task_id", sa.String(200), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("budget", JSON, nullable=False),
        sa.Column("brain", sa.String(64), nullable=False),
        sa.Column("target", sa.String(64), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("session_id", sa.String(64), nullable=True),
        sa.Column("sessions", JSON, nullable=False),
        sa.Column("result", JSON, nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("owner", sa.String(64), nullable=True),
        _ts("lease_until", nullable=True),
        _ts("created_at"),
        _ts("updated_at"),
        sa.PrimaryKeyConstraint("id", name="pk_orch_jobs"),
    )
    op.create_index("ix_orch_jobs_status", "orch_jobs", ["status"])


def _searches() -> None:
    op.create_table(
        "orch_searches",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("task_id", sa.String(200), nullable=False),
        sa.Column("algorithm", sa.String(32), nullable=False),
        sa.Column("config", JSON, nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        _ts("created_at"),
        _ts("updated_at"),
        sa.PrimaryKeyConstraint("id", name="pk_orch_searches"),
    )


def _expansions() -> None:
    op.create_table(
        "orch_expansions",
        sa.Column("search_id", sa.String(64), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("round", sa.Integer(), nullable=False),
        sa.Column("session_id", sa.String(64), nullable=False),
        sa.Column("parent_id", sa.String(64), nullable=True),
        sa.Column("strategy", sa.String(200), nullable=False),
        sa.Column("params", JSON, nullable=False),
        sa.Column("edge", sa.String(300), nullable=False),
        sa.Column("lane", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        _ts("created_at"),
        sa.PrimaryKeyConstraint("search_id", "n", name="pk_orch_expansions"),
        sa.UniqueConstraint("session_id", name="uq_orch_expansions_session_id"),
    )


def _adopt(table: str, create: Callable[[], None]) -> None:
    """Bring a table created outside Alembic to this revision's shape, keeping its rows."""
    bind = op.get_bind()
    inspector = sa.inspect(bind)
    columns = [c["name"] for c in inspector.get_columns(table)]
    if bind.dialect.name != "postgresql":
        # SQLite cannot rename or add constraints: rebuild the table under the store's names.
        for index in inspector.get_indexes(table):
            op.drop_index(index["name"], table_name=table)
        op.rename_table(table, f"{table}_old")
        create()
        listed = ", ".join(f'"{c}"' for c in columns)
        op.execute(f"INSERT INTO {table} ({listed}) SELECT {listed} FROM {table}_old")
        op.drop_table(f"{table}_old")
        return
    for column in JSON_COLUMNS[table]:
        op.execute(f'ALTER TABLE {table} ALTER COLUMN "{column}" TYPE JSONB USING "{column}"::jsonb')
    if table == "orch_jobs":
        for name, column in (("owner", sa.Column("owner", sa.String(64), nullable=True)),
                             ("lease_until", _ts("lease_until", nullable=True))):
            if name not in columns:
                op.add_column(table, column)
    # The old tables' keys carry PostgreSQL's default names: give them the store's naming convention.
    pk = inspector.get_pk_constraint(table)
    if pk.get("name") and pk["name"] != f"pk_{table}":
        op.execute(f'ALTER TABLE {table} RENAME CONSTRAINT "{pk["name"]}" TO "pk_{table}"')
    for unique in inspector.get_unique_constraints(table):
        want = f"uq_{table}_{unique['column_names'][0]}"
        if unique["name"] != want:
            op.execute(f'ALTER TABLE {table} RENAME CONSTRAINT "{unique["name"]}" TO "{want}"')


def upgrade() -> None:
    existing = set(sa.inspect(op.get_bind()).get_table_names())
    for table, create in (("orch_jobs", _jobs), ("orch_searches", _searches), ("orch_expansions", _expansions)):
        if table in existing:
            _adopt(table, create)
        else:
            create()
    op.create_table(
        "ledger",
        sa.Column("seq", SEQ, autoincrement=True, nullable=False),
        sa.Column("scope", sa.String(200), nullable=False),
        sa.Column("process", sa.String(200), nullable=False),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("tokens_in", sa.Integer(), nullable=False),
        sa.Column("tokens_out", sa.Integer(), nullable=False),
        sa.Column("cost_usd", sa.Float(), nullable=False),
        _ts("created_at"),
        sa.PrimaryKeyConstraint("seq", name="pk_ledger"),
    )
    op.create_index("ix_ledger_scope", "ledger", ["scope"])


def downgrade() -> None:
    op.drop_index("ix_ledger_scope", table_name="ledger")
    op.drop_table("ledger")
    op.drop_table("orch_expansions")
    op.drop_table("orch_searches")
    op.drop_index("ix_orch_jobs_status", table_name="orch_jobs")
    op.drop_table("orch_jobs")
