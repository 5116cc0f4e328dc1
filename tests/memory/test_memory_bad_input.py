"""Bad input ends in one clear error naming what and where, and loses nothing already stored."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from maxkernel.config import Settings
from memory import Memory
from memory.errors import (
    MemoryStoreError,
    SchemaTooNewError,
    StoreCorruptError,
    StoreLockedError,
    StoreUnreachableError,
    VectorStoreError,
)
from memory.migrate import code_head
from memory.store import Store


def _one_line(exc: pytest.ExceptionInfo[MemoryStoreError]) -> str:
    message = str(exc.value)
    assert "\n" not in message and message
    return message


def _filled_store(url: str) -> None:
    with Store.open(url) as s:
        s.add_candidate("t1", "def kernel(x):\n    return x\n")
        s.add_note("keep me", outcome="worked")


def _rows(url: str) -> tuple[int, int]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return (
                conn.execute(sa.text("SELECT count(*) FROM candidates")).scalar_one(),
                conn.execute(sa.text("SELECT count(*) FROM notes")).scalar_one(),
            )
    finally:
        engine.dispose()


def test_a_file_that_is_not_a_database(tmp_path: Path) -> None:
    path = tmp_path / "maxkernel.db"
    garbage = b"this is a text file, not SQLite\n" * 200
    path.write_bytes(garbage)
    with pytest.raises(StoreCorruptError) as info:
        Store.open(f"sqlite:///{path}")
    message = _one_line(info)
    assert str(path) in message and "not a SQLite database" in message
    assert path.read_bytes() == garbage  # left untouched


def test_a_database_with_damaged_pages(tmp_path: Path) -> None:
    path = tmp_path / "maxkernel.db"
    with Store.open(f"sqlite:///{path}") as s:
        for i in range(100):
            s.add_note(f"lesson {i} " * 40)
    data = bytearray(path.read_bytes())
    for offset in range(4096, len(data), 4096):  # keep the header page, wreck the others
        data[offset : offset + 1024] = bytes(range(256)) * 4
    path.write_bytes(bytes(data))
    with pytest.raises(StoreCorruptError, match="malformed") as info:
        Store.open(f"sqlite:///{path}")
    assert str(path) in _one_line(info)
    assert path.read_bytes() == bytes(data)


LOCKER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN EXCLUSIVE")
conn.execute("INSERT INTO notes (id, outcome, pattern, text, created_at) VALUES ('x', 'info', '', 'held', '2025-01-01')")
print("locked", flush=True)
sys.stdin.readline()
conn.execute("ROLLBACK")
"""


def test_a_file_locked_by_another_process(tmp_path: Path) -> None:
    path = tmp_path / "maxkernel.db"
    url = f"sqlite:///{path}"
    _filled_store(url)
    holder = subprocess.Popen(
        [sys.executable, "-c", LOCKER, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with pytest.raises(StoreLockedError) as info:  # opening needs the write lock to migrate
            Store.open(url, busy_timeout_s=0.3)
        assert str(path) in _one_line(info) and "locked by another process" in str(info.value)
    finally:
        assert holder.stdin is not None
        holder.stdin.write("\n")
        holder.stdin.flush()
        holder.wait(timeout=30)
    with Store.open(url) as s:
        assert s.stats().notes == 1 and s.stats().candidates == 1
        s.add_note("written once the lock is gone")
    assert _rows(url) == (1, 2)


def test_a_write_while_another_process_holds_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "maxkernel.db"
    url = f"sqlite:///{path}"
    _filled_store(url)
    with Store.open(url, busy_timeout_s=0.3) as store:
        holder = subprocess.Popen(
            [sys.executable, "-c", LOCKER, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
            with pytest.raises(StoreLockedError, match="while saving a note"):
                store.add_note("not now")
            assert store.stats().notes == 1  # readers are not blocked in WAL mode
        finally:
            assert holder.stdin is not None
            holder.stdin.write("\n")
            holder.stdin.flush()
            holder.wait(timeout=30)
        store.add_note("now")
    assert _rows(url) == (1, 2)


def test_an_unreachable_postgresql_server(unused_port: int) -> None:
    port = unused_port
    with pytest.raises(StoreUnreachableError) as info:
        Store.open(f"postgresql+psycopg://maxkernel:s3cret@127.0.0.1:{port}/memory", connect_timeout_s=2)
    message = _one_line(info)
    assert f"127.0.0.1:{port}/memory" in message and "cannot reach the store" in message
    assert "s3cret" not in message


def test_an_invalid_store_url() -> None:
    with pytest.raises(StoreUnreachableError, match="invalid store URL"):
        Store.open("not a url")


def test_a_schema_from_a_newer_version(store_url: str) -> None:
    _filled_store(store_url)
    engine = sa.create_engine(store_url)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE alembic_version SET version_num = '0099'"))
    with pytest.raises(SchemaTooNewError) as info:
        Store.open(store_url)
    message = _one_line(info)
    assert f"revision 0099 is newer than this MaxKernel's {code_head()}" in message and "upgrade MaxKernel" in message
    with engine.begin() as conn:
        assert conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar_one() == "0099"
        conn.execute(sa.text("UPDATE alembic_version SET version_num = 'a1b2c3'"))
    with pytest.raises(SchemaTooNewError, match="'a1b2c3' is unknown to this MaxKernel"):
        Store.open(store_url)
    engine.dispose()
    assert _rows(store_url) == (1, 1)


def test_an_unreachable_chroma_server(local_settings: Settings, unused_port: int) -> None:
    url = f"http://127.0.0.1:{unused_port}"
    with pytest.raises(VectorStoreError) as info:
        Memory.open(local_settings.model_copy(update={"chroma_url": url}))
    assert f"cannot reach the Chroma server at {url}" in _one_line(info)


def test_a_corrupt_embedded_chroma_store(local_settings: Settings) -> None:
    with Memory.open(local_settings) as memory:
        memory.remember_note("keep me")
    sqlite_file = local_settings.chroma_path / "chroma.sqlite3"
    sqlite_file.write_bytes(b"not chroma" * 100)
    with pytest.raises(VectorStoreError) as info:
        Memory.open(local_settings)
    assert str(local_settings.chroma_path) in _one_line(info)
    assert sqlite_file.read_bytes() == b"not chroma" * 100
    with Store.open(local_settings.resolved_store_url) as store:  # the SQL records are intact
        assert [n.text for n in store.list_notes()] == ["keep me"]


def test_the_cli_reports_a_corrupt_store_in_one_line(tmp_path: Path) -> None:
    data = tmp_path / "cli-data"
    data.mkdir()
    (data / "maxkernel.db").write_bytes(b"garbage" * 500)
    env = dict(os.environ, MAXKERNEL_DATA_DIR=str(data))
    result = subprocess.run([sys.executable, "-m", "memory.cli", "stats"], capture_output=True, text=True, env=env)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: store file is corrupt")
    assert str(data / "maxkernel.db") in lines[0]
