"""The first schema: tasks, sessions, candidates, evaluations, events, kernels, notes.

Revision ID: 0001
Revises:
Create Date: 2025-11-30
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(JSONB(), "postgresql")
SEQ = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _ts(name: str) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=False)


def upgrade() -> None:
    op.create_table(
        "tasks",
        sa.Column("id", sa.String(200), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("category", sa.String(40), nullable=True),
        sa.Column("source_digest", sa.String(64), nullable=False),
        sa.Column("signature", JSON, nullable=True),
        _ts("created_at"),
        _ts("updated_at"),
        sa.PrimaryKeyConstraint("id", name="pk_tasks"),
    )
    op.create_table(
        "sessions",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("task_id", sa.String(200), nullable=True),
        sa.Column("mode", sa.String(32), nullable=False),
        sa.Column("brain", sa.String(64), nullable=False),
        sa.Column("target", sa.String(64), nullable=False),
        sa.Column("budget", JSON, nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        _ts("created_at"),
        _ts("updated_at"),
        sa.PrimaryKeyConstraint("id", name="pk_sessions"),
    )
    op.create_index("ix_sessions_task_id", "sessions", ["task_id"])
    op.create_index("ix_sessions_status", "sessions", ["status"])
    op.create_table(
        "candidates",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("task_id", sa.String(200), nullable=False),
        sa.Column("session_id", sa.String(64), nullable=True),
        sa.Column("parent_id", sa.String(64), nullable=True),
        sa.Column("code", sa.Text(), nullable=False),
        sa.Column("code_sha", sa.String(64), nullable=False),
        sa.Column("strategy", sa.String(200), nullable=False),
        sa.Column("produced_by", sa.String(200), nullable=False),
        _ts("created_at"),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"], name="fk_candidates_task_id"),
        sa.PrimaryKeyConstraint("id", name="pk_candidates"),
    )
    for column in ("task_id", "session_id", "parent_id", "code_sha"):
        op.create_index(f"ix_candidates_{column}", "candidates", [column])
    op.create_table(
        "evaluations",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("candidate_id", sa.String(64), nullable=False),
        sa.Column("task_id", sa.String(200), nullable=False),
        sa.Column("target", sa.String(64), nullable=False),
        sa.Column("size", sa.String(32), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("correct", sa.Boolean(), nullable=False),
        sa.Column("speedup", sa.Float(), nullable=True),
        sa.Column("kernel_ms", sa.Float(), nullable=True),
        sa.Column("ref_ms", sa.Float(), nullable=True),
        sa.Column("basis", sa.String(16), nullable=True),
        sa.Column("report", JSON, nullable=False),
        _ts("created_at"),
        sa.ForeignKeyConstraint(["candidate_id"], ["candidates.id"], name="fk_evaluations_candidate_id"),
        sa.PrimaryKeyConstraint("id", name="pk_evaluations"),
    )
    for column in ("candidate_id", "task_id", "status"):
        op.create_index(f"ix_evaluations_{column}", "evaluations", [column])
    op.create_table(
        "events",
        sa.Column("seq", SEQ, autoincrement=True, nullable=False),
        sa.Column("session_id", sa.String(64), nullable=True),
        sa.Column("correlation_id", sa.String(64), nullable=True),
        sa.Column("message_type", sa.String(100), nullable=False),
        sa.Column("task_id", sa.String(200), nullable=True),
        sa.Column("candidate_id", sa.String(64), nullable=True),
        sa.Column("payload", JSON, nullable=False),
        _ts("created_at"),
        sa.PrimaryKeyConstraint("seq", name="pk_events"),
    )
    op.create_index("ix_events_session_seq", "events", ["session_id", "seq"])
    op.create_index("ix_events_correlation_id", "events", ["correlation_id"])
    op.create_index("ix_events_message_type", "events", ["message_type"])
    op.create_table(
        "kernels",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("task_id", sa.String(200), nullable=False),
        sa.Column("candidate_id", sa.String(64), nullable=False),
        sa.Column("evaluation_id", sa.String(64), nullable=False),
        sa.Column("target", sa.String(64), nullable=False),
        sa.Column("speedup", sa.Float(), nullable=True),
        sa.Column("strategy", sa.String(200), nullable=False),
        sa.Column("code_sha", sa.String(64), nullable=False),
        _ts("created_at"),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"], name="fk_kernels_task_id"),
        sa.ForeignKeyConstraint(["candidate_id"], ["candidates.id"], name="fk_kernels_candidate_id"),
        sa.ForeignKeyConstraint(["evaluation_id"], ["evaluations.id"], name="fk_kernels_evaluation_id"),
        sa.PrimaryKeyConstraint("id", name="pk_kernels"),
        # code_sha first: the duplicate check of a bulk insert looks kernels up by code hash.
        sa.UniqueConstraint("code_sha", "task_id", "target", name="uq_kernels_code_task_target"),
    )
    for column in ("task_id", "target", "created_at"):
        op.create_index(f"ix_kernels_{column}", "kernels", [column])
    op.create_table(
        "notes",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("task_id", sa.String(200), nullable=True),
        sa.Column("session_id", sa.String(64), nullable=True),
        sa.Column("target", sa.String(64), nullable=True),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("pattern", sa.String(400), nullable=False),
        sa.Column("category", sa.String(40), nullable=True),
        sa.Column("text", sa.Text(), nullable=False),
        _ts("created_at"),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"], name="fk_notes_task_id"),
        sa.PrimaryKeyConstraint("id", name="pk_notes"),
    )
    op.create_index("ix_notes_task_id", "notes", ["task_id"])
    op.create_index("ix_notes_created_at", "notes", ["created_at"])
    _append_only_events()


def _append_only_events() -> None:
    """The event log is the source of truth: the database itself refuses to rewrite it."""
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            "CREATE FUNCTION events_append_only() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN RAISE EXCEPTION 'events are append-only'; END $$"
        )
        op.execute(
            "CREATE TRIGGER events_no_rewrite BEFORE UPDATE OR DELETE ON events "
            "FOR EACH ROW EXECUTE FUNCTION events_append_only()"
        )
        op.execute(
            "CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON events "
            "FOR EACH STATEMENT EXECUTE FUNCTION events_append_only()"
        )
    else:
        for verb in ("UPDATE", "DELETE"):
            op.execute(
                f"CREATE TRIGGER events_no_{verb.lower()} BEFORE {verb} ON events "
                "BEGIN SELECT RAISE(ABORT, 'events are append-only'); END"
            )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS events_no_truncate ON events")
        op.execute("DROP TRIGGER IF EXISTS events_no_rewrite ON events")
        op.execute("DROP FUNCTION IF EXISTS events_append_only()")
    for table in ("notes", "kernels", "events", "evaluations", "candidates", "sessions", "tasks"):
        op.drop_table(table)
