"""A daemon's memory: it waits out a Chroma server that is down for a moment instead of failing the job.

A fleet's Chroma server may die and be started again while daemons work. The memory's writes are already
all or nothing (a kernel or note whose vector could not be stored is rolled back in SQL), so a write that
failed for want of Chroma can simply be made again once the server answers; a job's end (its winner and
note remembered) waits for that rather than ending the job as failed. Recall waits the same way while the
memory is first opened, and afterwards stays advice (the librarian goes on without it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import structlog

from actors.services import Services
from memory import Memory
from memory.errors import VectorStoreError
from memory.models import NewKernel, NoteRecord

log = structlog.get_logger("orchestrators.daemon_memory")

T = TypeVar("T")
WAIT_S = 90.0
PAUSE_S = 0.25  # a restarted Chroma server is used within a quarter second of answering


def patiently(doing: str, call: Callable[[], T], wait_s: float = WAIT_S, pause_s: float = PAUSE_S) -> T:
    """``call()``, made again while Chroma cannot be reached, for at most ``wait_s`` seconds."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return call()
        except VectorStoreError as exc:
            if time.monotonic() + pause_s > deadline:
                raise
            log.warning("daemon.memory_waiting", doing=doing, error=str(exc)[:300])
            time.sleep(pause_s)


class PatientMemory(Memory):
    """``Memory`` whose opening and writes wait for Chroma to answer again."""

    wait_s: float = WAIT_S

    @classmethod
    def open(cls, settings: Any = None, *, busy_timeout_s: float = 30.0, for_reindex: bool = False) -> "PatientMemory":
        opened = patiently("opening the memory", lambda: super(PatientMemory, cls).open(
            settings, busy_timeout_s=busy_timeout_s, for_reindex=for_reindex), cls.wait_s)
        assert isinstance(opened, PatientMemory)
        return opened

    def store_kernels(self, entries: Sequence[NewKernel], *, tasks: Sequence[Any] | None = None) -> list[tuple[str, bool]]:
        return patiently("remembering kernels", lambda: Memory.store_kernels(self, entries, tasks=tasks), self.wait_s)

    def remember_note(self, text: str, **fields: Any) -> NoteRecord:
        return patiently("remembering a note", lambda: Memory.remember_note(self, text, **fields), self.wait_s)

    def import_note(self, note: NoteRecord) -> NoteRecord:
        return patiently("importing a note", lambda: Memory.import_note(self, note), self.wait_s)


class DaemonServices(Services):
    """The daemon's services: the same, with a memory that waits out a restarting Chroma server."""

    def open_memory(self) -> Memory:
        return PatientMemory.open(self.settings)
