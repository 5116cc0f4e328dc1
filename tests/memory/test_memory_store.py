"""The SQL store, on a SQLite file and on PostgreSQL: migrations, records, the event log."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from pydantic import BaseModel

from jaxbench.report import CheckResult, EvalReport
from memory.errors import MemoryStoreError, RecordNotFoundError
from memory.migrate import code_head
from memory.models import EventIn
from memory.schema import Base
from memory.store import Store

TABLES = {"tasks", "sessions", "candidates", "evaluations", "events", "kernels", "notes", "orch_jobs",
          "orch_searches", "orch_expansions", "ledger", "alembic_version"}


@pytest.fixture
def store(store_url: str):
    with Store.open(store_url) as s:
        yield s


def test_open_applies_the_migrations(store: Store) -> None:
    assert store.revision == code_head() == "0002"
    assert TABLES <= set(sa.inspect(store.engine).get_table_names())
    with store.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar_one() == "0002"


def test_migrations_build_exactly_the_model_schema(store: Store) -> None:
    """A change to memory/schema.py without a migration fails here."""
    with store.engine.connect() as conn:
        diffs = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diffs == []


def test_sessions_candidates_evaluations_round_trip(store: Store) -> None:
    session = store.create_session(mode="auto", brain="rules", target="cpu", budget={"minutes": 30}, task_id="t1")
    store.set_session_status(session.id, "done")
    got = store.get_session(session.id)
    assert (got.mode, got.brain, got.target, got.budget, got.status) == ("auto", "rules", "cpu", {"minutes": 30}, "done")

    parent = store.add_candidate("t1", "def kernel(x):\n    return x\n", session_id=session.id, strategy="baseline")
    child = store.add_candidate(
        "t1", "def kernel(x):\n    return x * 1\n", session_id=session.id, parent_id=parent.id,
        strategy="tile 128", produced_by="coder/rules",
    )  # fmt: skip
    assert store.get_candidate(child.id).model_dump() == child.model_dump()
    assert child.parent_id == parent.id and child.produced_by == "coder/rules"

    report = EvalReport(
        task="t1", status="incorrect", reason="output 0 differs", max_abs_err=0.5,
        checks=[CheckResult(name="seed 1", passed=False, detail="max err 0.5")], flags=["slow compile"],
        model={"flops": 1.5e9},
    )  # fmt: skip
    store.add_evaluation(child.id, report)
    [evaluation] = store.evaluations(child.id)
    assert evaluation.report == report  # the full report, nested checks included


def test_events_are_ordered_and_append_only(store: Store) -> None:
    events = [
        EventIn(message_type="Plan", payload={"i": i, "text": "ü"}, session_id=f"s{i % 2}", correlation_id=f"c{i}")
        for i in range(40)
    ]
    seqs = store.append_events(events[:25]) + [store.append_events([e])[0] for e in events[25:]]
    assert seqs == sorted(seqs) and len(set(seqs)) == 40
    s0 = store.events(session_id="s0")
    assert [e.payload["i"] for e in s0] == list(range(0, 40, 2))
    assert [e.payload["i"] for e in store.events(after=seqs[29])] == list(range(30, 40))
    assert store.events(correlation_id="c7")[0].payload == {"i": 7, "text": "ü"}

    for statement in ("UPDATE events SET message_type = 'forged'", "DELETE FROM events"):
        with pytest.raises(sa.exc.DatabaseError, match="append-only"), store.engine.begin() as conn:
            conn.execute(sa.text(statement))
    assert len(store.events()) == 40 and {e.message_type for e in store.events()} == {"Plan"}


class KernelDraft(BaseModel):
    session_id: str
    code: str


def test_a_pydantic_message_is_recorded_under_its_type(store: Store) -> None:
    seq = store.append_event(KernelDraft(session_id="s", code="x"), session_id="s", task_id="t1", candidate_id="c")
    [event] = store.events(session_id="s")
    assert (event.seq, event.message_type, event.payload) == (seq, "KernelDraft", {"session_id": "s", "code": "x"})
    assert (event.task_id, event.candidate_id) == ("t1", "c")


def test_notes_and_lookups(store: Store) -> None:
    first = store.add_note("tile the reduction axis", outcome="worked", task_id="t1", target="cpu")
    second = store.add_note("double buffering did not help", outcome="failed")
    assert [n.id for n in store.list_notes()] == [second.id, first.id]  # newest first
    assert store.resolve_id(first.id[:10]) == ("note", first.id)
    with pytest.raises(RecordNotFoundError, match="no kernel or note"):
        store.resolve_id("ffffffffff")
    with pytest.raises(RecordNotFoundError):
        store.get_session("nope")
    with pytest.raises(MemoryStoreError):
        store.add_evaluation("no-such-candidate", EvalReport(task="t1", status="timeout"))


def test_reopening_keeps_everything(store_url: str) -> None:
    with Store.open(store_url) as s:
        s.add_candidate("t1", "code")
        s.append_events([EventIn(message_type="M", payload={"n": n}) for n in range(5)])
        s.add_note("lesson")
    with Store.open(store_url) as s:
        stats = s.stats()
        assert (stats.tasks, stats.candidates, stats.events, stats.notes) == (1, 1, 5, 1)
        assert stats.schema_revision == code_head()


def test_sqlite_runs_in_wal_mode(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'wal.db'}"
    with Store.open(url) as s, s.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar_one() == "wal"
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar_one() == 1


def test_a_candidate_recorded_twice_under_its_id_is_stored_once(store: Store) -> None:
    code = "def kernel(x):\n    return x\n"
    first = store.add_candidate("t1", code, strategy="baseline", id="cand-fixed-id")
    again = store.add_candidate("t1", code, strategy="baseline", id="cand-fixed-id")
    assert again.model_dump() == first.model_dump()
    assert store.stats().candidates == 1
    with pytest.raises(ValueError, match="different code"):
        store.add_candidate("t1", code + "# changed\n", id="cand-fixed-id")
