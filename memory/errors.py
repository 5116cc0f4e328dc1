"""Errors of the memory: each one names what failed and where, in one line.

Every failure a user can cause (a bad URL, a locked or corrupt file, a server that is down, a schema
written by a newer MaxKernel, a malformed import file) is one of these, so that a CLI or an
orchestrator can catch ``MemoryStoreError`` and print its message without a traceback.
"""

from __future__ import annotations


def one_line(text: object) -> str:
    """Collapse a driver message (often several lines) into one."""
    return " ".join(str(text).split())


class MemoryStoreError(Exception):
    """Base of all memory errors; ``str(exc)`` is a single line naming what and where."""

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))


class StoreUnreachableError(MemoryStoreError):
    """The SQL store cannot be reached or opened (server down, bad host, unwritable path)."""


class StoreLockedError(MemoryStoreError):
    """Another process holds the SQLite file locked for longer than the busy timeout."""


class StoreCorruptError(MemoryStoreError):
    """The SQLite file is not a database or is damaged; it is left untouched."""


class SchemaTooNewError(MemoryStoreError):
    """The store was migrated by a newer MaxKernel than this one; it is left untouched."""


class VectorStoreError(MemoryStoreError):
    """Chroma cannot be opened or reached, or its collections do not match the settings."""


class EmbeddingError(MemoryStoreError):
    """The configured embedding cannot be used (unknown name, package or model not installed)."""


class UnverifiedKernelError(MemoryStoreError):
    """Only kernels whose report passed (status ok and correct) may be remembered."""


class RecordNotFoundError(MemoryStoreError):
    """No kernel or note with the given id (or id prefix)."""


class TransferFileError(MemoryStoreError):
    """An export file that cannot be written, or an import file that cannot be read or has a
    malformed line (then nothing was imported)."""
