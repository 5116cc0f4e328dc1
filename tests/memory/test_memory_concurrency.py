"""Two real processes writing the same store at once lose nothing (SQLite file and PostgreSQL)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import sqlalchemy as sa

from memory.store import Store

WRITER = Path(__file__).with_name("memory_writer.py")
EVENTS = 150


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
            assert conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalars().all() == ["0001"]
