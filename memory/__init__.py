"""Persistent memory of MaxKernel: the SQL store and the vector memory of verified kernels and notes.

``Memory.open(settings)`` opens both; ``Store`` alone is the SQL store (sessions, candidates,
evaluations, the event log) for code that records rather than recalls.
"""

from memory.errors import (
    EmbeddingError,
    MemoryStoreError,
    RecordNotFoundError,
    SchemaTooNewError,
    StoreCorruptError,
    StoreLockedError,
    StoreUnreachableError,
    TransferFileError,
    UnverifiedKernelError,
    VectorStoreError,
)
from memory.facade import Memory
from memory.models import (
    EventIn,
    EventRecord,
    KernelHit,
    KernelRecord,
    MemoryStats,
    NewKernel,
    NoteHit,
    NoteRecord,
    StoreStats,
)
from memory.store import Store

__all__ = [
    "EmbeddingError",
    "EventIn",
    "EventRecord",
    "KernelHit",
    "KernelRecord",
    "Memory",
    "MemoryStats",
    "MemoryStoreError",
    "NewKernel",
    "NoteHit",
    "NoteRecord",
    "RecordNotFoundError",
    "SchemaTooNewError",
    "Store",
    "StoreCorruptError",
    "StoreLockedError",
    "StoreStats",
    "StoreUnreachableError",
    "TransferFileError",
    "UnverifiedKernelError",
    "VectorStoreError",
]
