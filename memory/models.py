"""Pydantic records that leave the memory: what the store returns and what recall hands back."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from jaxbench.report import EvalReport
from maxkernel.analysis.signature import TaskSignature

Outcome = Literal["worked", "failed", "info"]


class _Record(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class TaskInfo(_Record):
    id: str
    name: str = ""
    category: str | None = None
    source_digest: str = ""
    signature: TaskSignature | None = None


class SessionInfo(_Record):
    id: str
    task_id: str | None = None
    mode: str
    brain: str
    target: str
    budget: dict[str, Any] = Field(default_factory=dict)
    status: str
    created_at: datetime
    updated_at: datetime


class CandidateInfo(_Record):
    id: str
    task_id: str
    session_id: str | None = None
    parent_id: str | None = None
    code: str
    code_sha: str
    strategy: str = ""
    produced_by: str = ""
    created_at: datetime


class EvaluationInfo(_Record):
    id: str
    candidate_id: str
    report: EvalReport
    created_at: datetime


class EventIn(BaseModel):
    """One bus message to append to the event log."""

    message_type: str
    payload: dict[str, Any]
    session_id: str | None = None
    correlation_id: str | None = None
    task_id: str | None = None
    candidate_id: str | None = None


class EventRecord(EventIn):
    model_config = ConfigDict(from_attributes=True)
    seq: int
    created_at: datetime


class KernelRecord(BaseModel):
    """A remembered verified kernel: its code, where it came from, and how it fared."""

    id: str
    task_id: str
    target: str
    speedup: float | None = None
    kernel_ms: float | None = None
    ref_ms: float | None = None
    basis: str | None = None
    strategy: str = ""
    produced_by: str = ""
    category: str | None = None
    pattern: str = ""
    candidate_id: str
    evaluation_id: str
    session_id: str | None = None
    parent_id: str | None = None
    code: str
    report: EvalReport
    created_at: datetime


class NewKernel(BaseModel):
    """A verified kernel on its way into the store (fresh, or read from an export file)."""

    id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    task_id: str
    code: str
    report: EvalReport
    strategy: str = ""
    produced_by: str = ""
    session_id: str | None = None
    candidate_id: str | None = None
    parent_id: str | None = None
    created_at: datetime | None = None


class NoteRecord(BaseModel):
    """A remembered optimization lesson."""

    model_config = ConfigDict(from_attributes=True)
    id: str
    text: str
    outcome: Outcome
    pattern: str = ""
    task_id: str | None = None
    target: str | None = None
    category: str | None = None
    session_id: str | None = None
    created_at: datetime


class KernelHit(BaseModel):
    """A recalled kernel: ``score`` is the cosine similarity (1.0 for the same structure)."""

    kind: Literal["kernel"] = "kernel"
    score: float
    kernel: KernelRecord


class NoteHit(BaseModel):
    kind: Literal["note"] = "note"
    score: float
    note: NoteRecord


class StoreStats(BaseModel):
    """Row counts of the SQL store, and how the kernels split by target and category."""

    where: str
    schema_revision: str | None
    tasks: int
    sessions: int
    candidates: int
    evaluations: int
    events: int
    kernels: int
    notes: int
    kernels_by_target: dict[str, int] = Field(default_factory=dict)
    kernels_by_category: dict[str, int] = Field(default_factory=dict)
    best_speedup: float | None = Field(None, description="the speedup of the kernel whose interval has the highest "
                                                       "lower end (a lucky reading never ranks first)")
    best_speedup_ci: tuple[float, float] | None = None


class MemoryStats(BaseModel):
    store: StoreStats
    vectors_where: str
    embedding: str
    kernel_vectors: int
    note_vectors: int


class Spend(BaseModel):
    """What the fleet has booked to one ledger scope (a session, or a budget shared by many)."""

    scope: str
    calls: int = 0
    tokens: int = 0
    cost_usd: float = 0.0
