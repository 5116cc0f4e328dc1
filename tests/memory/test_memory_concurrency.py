"""Two real processes writing the same store at once lose nothing (SQLite file and PostgreSQL), and a
fresh SQLite file's switch to WAL waits out a lock that SQLite reports without waiting."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import sqlalchemy as sa

from memory.migrate import code_head
from memory.store import Store

WRITER = Path(__file__).with_name("memory_writer.py")
EVENTS = 150


@pytest.mark.slow
def test_two_processes_writing_at_once_lose_nothing(store_url: str, tmp_path: Path) -> None:
    go = tmp_path / "go"
    writers = [
        subprocess.Popen(
            [sys.executable, str(WRITER), store_url, tag, str(EVENTS), str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for tag in ("a", "b")
    ]
    for proc in writers:  # both imported: start them together on a store nobody has created yet
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    go.touch()
    for proc in writers:
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err
        assert out.strip() == "done"

    with Store.open(store_url) as store:
        events = store.events()
        assert len(events) == 2 * EVENTS
        assert len({e.seq for e in events}) == 2 * EVENTS
        for tag in ("a", "b"):  # each writer's events, in the order it wrote them
            assert [e.payload["i"] for e in events if e.payload["writer"] == tag] == list(range(EVENTS))
        stats = store.stats()
        assert stats.candidates == 2 * EVENTS // 10 and stats.notes == 2 * EVENTS // 10
        assert stats.tasks == 3  # task_a, task_b, shared_task: created once despite the race
        with store.engine.connect() as conn:
            assert conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalars().all() == [code_head()]


def test_switching_to_wal_waits_for_a_lock_sqlite_reports_at_once(tmp_path: Path) -> None:
    from memory.engine import _enter_wal

    path = tmp_path / "fresh.db"
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN EXCLUSIVE")  # another process in the middle of creating the store
    mine = sqlite3.connect(path, timeout=0, isolation_level=None)  # BUSY comes back at once, as in the race
    cursor = mine.cursor()
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        _enter_wal(cursor, busy_timeout_s=0.2)  # a lock that outlives the timeout is still an error

    threading.Timer(0.3, lambda: holder.execute("COMMIT")).start()
    _enter_wal(cursor, busy_timeout_s=10)
    assert cursor.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    holder.close()
    mine.close()


def test_two_writers_remembering_one_kernel_at_once_store_it_once(store_url: str) -> None:
    """The second writer waits for the first and finds its kernel, instead of failing on the unique key
    (a fleet's two daemons finishing the same task with the same code)."""
    from jaxbench.report import EvalReport
    from memory.models import NewKernel

    code = "def kernel(x):\n    return x * 2\n"
    report = EvalReport(task="t_same", status="ok", correct=True, speedup=1.5, basis="measured")
    with Store.open(store_url) as first, Store.open(store_url) as second:
        got: list[object] = []

        def rival() -> None:
            try:
                with second.write("remembering kernels") as tx:
                    got.append(tx.add_kernels([NewKernel(task_id="t_same", code=code, report=report)]))
            except Exception as exc:  # the failure this test is about: kept to be asserted on
                got.append(exc)

        with first.write("remembering kernels") as tx:
            (kid, new), = tx.add_kernels([NewKernel(task_id="t_same", code=code, report=report)])
            thread = threading.Thread(target=rival)
            thread.start()
            thread.join(timeout=1.0)  # the rival runs while this transaction holds its insert uncommitted
        thread.join(timeout=60)
        assert new and not thread.is_alive()
        assert got == [[(kid, False)]], got
        assert first.stats().kernels == 1
