"""A daemon's memory on a Chroma server that is killed: a note remembered while the server is down waits
for it to come back, and afterwards every record in SQL has its vector and every vector its record."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from maxkernel.config import Settings
from memory import Memory
from memory.errors import VectorStoreError
from orchestrators import fleet
from orchestrators.daemon_memory import PatientMemory


def test_a_write_while_chroma_is_down_waits_for_it_and_the_memory_stays_consistent(tmp_path: Path) -> None:
    root = tmp_path / "fleet"
    chroma = fleet.start_chroma(root)
    url = f"http://127.0.0.1:{chroma.port}"
    store_url = f"sqlite:///{tmp_path / 'memory.db'}"
    settings = Settings(data_dir=str(tmp_path / "data"), store_url=store_url, chroma_url=url)
    restarted: list[fleet.Proc] = []
    try:
        with PatientMemory.open(settings) as memory:
            memory.remember_note("rowblock tiles of 4096 rows beat the reference on RMSNorm", outcome="worked")
            os.killpg(chroma.pid, signal.SIGKILL)
            while fleet.alive(chroma.pid):
                time.sleep(0.05)
            plain = Memory(memory.store, memory.vectors, memory.embedder)  # the same parts, without the patience
            with pytest.raises(VectorStoreError):
                plain.remember_note("a plain memory gives up at once", outcome="info")

            def restart() -> None:
                time.sleep(2.0)
                restarted.append(fleet.start_chroma(root, chroma.port))

            thread = threading.Thread(target=restart)
            thread.start()
            began = time.monotonic()
            note = memory.remember_note("a note written while the server was down", outcome="info")
            waited = time.monotonic() - began
            thread.join()
            assert restarted and waited > 1.0  # it was made again once the server answered
        audit = fleet.memory_audit(store_url, url)
        assert (audit.notes, audit.kernels) == (2, 0) and audit.consistent, audit
        assert note.id not in audit.missing_vectors

        with PatientMemory.open(settings) as memory:  # an orphan vector (its SQL record gone) is found
            memory.vectors.upsert("notes", ["orphan-0"], [memory.embedder.embed(None, "stray")], [{"task": "x"}])
        assert fleet.memory_audit(store_url, url).orphan_vectors == ["orphan-0"]
    finally:
        fleet.stop_procs([chroma, *restarted], wait_s=5)
