"""The orchestrators' tables are there on every store an engine is opened on."""

from __future__ import annotations

import pytest
import gc
import sqlite3
import weakref
from pathlib import Path

import sqlalchemy as sa


@pytest.mark.slow
def test_every_new_engine_is_migrated_even_where_a_freed_one_had_its_id(tmp_path: Path) -> None:
    # A freed engine's id() comes back for a later one (most runs see it within a few engines, but not every
    # run: addresses depend on what else the process holds); a store keyed by it once skipped the migration of
    # a fresh store, and the first insert failed with "no such table: orch_jobs". Every store is checked, and
    # what ``ensure`` remembers must let a freed engine go, so nothing it holds can stand for a new one.
    from orchestrators import tables

    for i in range(30):
        engine = sa.create_engine(f"sqlite:///{tmp_path}/store{i}.db")
        tables.ensure(engine)
        assert engine in tables._ready
        alive = weakref.ref(engine)
        engine.dispose()
        del engine
        gc.collect()
        assert alive() is None, "a freed engine is still held"
        with sqlite3.connect(tmp_path / f"store{i}.db") as conn:
            assert conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'orch_jobs'").fetchone(), f"store {i}"
