"""Vectors whose records never committed: a writer killed between its vector and its commit, and a Chroma
that stored a vector and failed before answering. Either leaves a vector SQL does not know; the memory
forgets it (the dead writer's, when told the writer is dead; its own, once Chroma answers again)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from jaxbench import load_task
from maxkernel.config import Settings
from memory import Memory
from memory.errors import VectorStoreError
from memory.vectors import NOTES, WRITER, VectorMemory, writer_name

# A writer that dies (SIGKILL) right after Chroma took its note's vector, before SQL committed the note.
KILLED_WRITER = textwrap.dedent("""
    import os, signal, sys
    from maxkernel.config import Settings
    from memory import Memory
    from memory.vectors import VectorMemory

    real = VectorMemory.upsert
    def upsert_then_die(self, *args, **kwargs):
        real(self, *args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)
    VectorMemory.upsert = upsert_then_die
    settings = Settings(data_dir=sys.argv[1], store_url=sys.argv[2], chroma_url=sys.argv[3])
    with Memory.open(settings) as memory:
        memory.remember_note("written by a process that dies before its commit", outcome="info")
""")


@pytest.fixture
def memory(settings: Settings):
    with Memory.open(settings) as m:
        yield m


@pytest.mark.slow
def test_a_dead_writers_unrecorded_vector_is_forgotten(settings: Settings, tmp_path: Path) -> None:
    with Memory.open(settings) as memory:  # the store and collections exist before the writer starts
        kept = memory.remember_note("a note whose record committed", outcome="info")
    child = subprocess.run([sys.executable, "-c", KILLED_WRITER, settings.data_dir, settings.resolved_store_url,
                            settings.chroma_url], capture_output=True, text=True, timeout=120,
                           env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
    with Memory.open(settings) as memory:
        stored = set(memory.vectors._collections[NOTES].get(include=[])["ids"])
        recorded = {n.id for n in memory.store.list_notes()}
        assert recorded == {kept.id} and len(stored - recorded) == 1  # the dead writer's orphan
        assert memory.forget_unrecorded(writer_name()) == 0  # this live process wrote nothing unrecorded
        dead = next(iter(stored - recorded))
        writer = memory.vectors._collections[NOTES].get(ids=[dead], include=["metadatas"])["metadatas"][0][WRITER]
        assert writer.rpartition(":")[2].isdigit() and writer != writer_name()
        assert memory.forget_unrecorded(writer) == 1
        assert set(memory.vectors._collections[NOTES].get(include=[])["ids"]) == {kept.id}


def test_a_vector_stored_by_a_chroma_that_then_failed_is_forgotten_once_it_answers(
        memory: Memory, task_dir, monkeypatch: pytest.MonkeyPatch) -> None:
    task = load_task(task_dir("t_gemm_relu"))
    real = VectorMemory.upsert

    def stored_then_failed(self: VectorMemory, *args: object, **kwargs: object) -> None:
        real(self, *args, **kwargs)  # type: ignore[arg-type]
        raise VectorStoreError("Chroma failed while storing 1 vector(s) in 'notes': connection reset")

    monkeypatch.setattr(VectorMemory, "upsert", stored_then_failed)
    with pytest.raises(VectorStoreError):
        memory.remember_note("blocks of 256 rows won", task=task, outcome="worked", target="cpu")
    assert memory.store.list_notes() == [] and memory.vectors.count(NOTES) == 1  # rolled back, vector left
    monkeypatch.setattr(VectorMemory, "upsert", real)
    note = memory.remember_note("blocks of 256 rows won", task=task, outcome="worked", target="cpu")  # the retry
    assert [n.id for n in memory.store.list_notes()] == [note.id]
    assert memory.vectors._collections[NOTES].get(include=[])["ids"] == [note.id]
