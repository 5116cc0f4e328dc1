"""Every message on the actor bus, as pydantic models.

One module so that the local runtime, the gRPC runtime (which needs a serializer per type) and the event
log all agree on the same set. Each message carries the ids that tie it into a session: ``session_id``,
``task_id``, the ``candidate_id`` it is about and the ``parent_id`` it was derived from.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from typing import Any, Literal

from pydantic import BaseModel, Field

from jaxbench.report import EvalReport as JudgeReport


def new_id() -> str:
    return uuid.uuid4().hex


def _now() -> datetime:
    return datetime.now(timezone.utc)


class BusMessage(BaseModel):
    """Fields common to every message; ``sender`` names the actor role that published it."""

    session_id: str
    task_id: str
    candidate_id: str | None = None
    parent_id: str | None = None
    message_id: str = Field(default_factory=new_id)
    sender: str = ""
    sent_at: datetime = Field(default_factory=_now)


class Budget(BaseModel):
    """Limits of one session; ``None`` means unlimited."""

    max_tokens: int | None = None
    max_cost_usd: float | None = None
    max_fix_attempts: int = 2
    tune_budget_s: float = 60.0
    tune_max_trials: int | None = 4
    share_ends_at: float | None = Field(None, description="epoch seconds when the current strategy's share of the "
                                        "session's time ends; a tuner starts no trial that would end after it")
    seed: int = Field(0, description="seed of the tuner's search order")


class OptimizeRequest(BusMessage):
    target: str = "cpu"
    size: str = "cpu"
    brain: str = "rules"
    budget: Budget = Field(default_factory=Budget)
    feedback: str = Field(default="", description="what earlier iterations of this session learned")
    exclude: list[str] = Field(default_factory=list, description="strategy names already tried in this session")


class StrategyRef(BaseModel):
    """One way to write the kernel: a rules strategy (name, params, space) or an LLM approach in words."""

    name: str
    kind: str = "llm"
    params: dict[str, Any] = Field(default_factory=dict)
    space: dict[str, list[Any]] = Field(default_factory=dict)
    rationale: str = ""
    target: str = "cpu"
    extents: dict[str, int] = Field(default_factory=dict, description="what each block parameter tiles")
    defaults: dict[str, Any] = Field(default_factory=dict, description="the strategy's own parameters, kept when "
                                     "memory drafts it at others: what a draft at memory's parameters falls back to")
    prior: float | None = Field(None, description="memory's score of it on the nearest measured tasks (log of the "
                                "speedup, similarity weighted; < 0: failed or lost there); None: memory knows nothing")
    work_ratio: float | None = Field(None, description="a rewrite's arithmetic over the reference's, by shapes "
                                     "(under 1: it removes work); None: not a rewrite, or not counted")


class Plan(BusMessage):
    target: str = "cpu"
    size: str = "cpu"
    budget: Budget = Field(default_factory=Budget)
    analysis: str = ""
    strategies: list[StrategyRef]
    step: int = Field(0, description="index of the strategy being worked on")
    recalled: list[str] = Field(default_factory=list, description="ids of recalled kernels and notes used")
    notes: str = ""

    @property
    def current(self) -> StrategyRef:
        return self.strategies[self.step]


class KernelDraft(BusMessage):
    plan: Plan
    source: str
    produced_by: str = ""
    attempt: int = Field(0, description="how many fixes led to this draft")


class EvalRequest(BusMessage):
    """A direct request to the tester (an LLM actor's evaluate tool): answered with an EvalReport."""

    draft: KernelDraft
    timing: bool = True


class EvalReport(BusMessage):
    """The judge's report on one draft, with the draft it judged."""

    draft: KernelDraft
    report: JudgeReport


class FixRequest(BusMessage):
    draft: KernelDraft
    report: JudgeReport


class DraftAbandoned(BusMessage):
    """The debugger gave up on a strategy: the coder moves to the next one."""

    plan: Plan
    reason: str


class ProfileReport(BusMessage):
    draft: KernelDraft
    report: JudgeReport
    bound: str = ""
    diagnosis: str
    suggestions: list[str] = Field(default_factory=list)


class TuneTrial(BaseModel):
    params: dict[str, Any] = Field(default_factory=dict)
    status: str
    speedup: float | None = None
    kernel_ms: float | None = None


class TuneReport(BusMessage):
    best_source: str
    best_report: JudgeReport
    best_params: dict[str, Any] = Field(default_factory=dict)
    trials: list[TuneTrial] = Field(default_factory=list)
    strategy: str = ""


class CandidateScored(BusMessage):
    source: str
    report: JudgeReport
    strategy: str = ""
    produced_by: str = ""
    diagnosis: str = ""


class RecallRequest(BusMessage):
    target: str = "cpu"
    k: int = 3


class RecalledKernel(BaseModel):
    id: str
    task_id: str
    score: float
    strategy: str = ""
    speedup: float | None = None
    speedup_ci: tuple[float, float] | None = None
    code: str

    @property
    def low(self) -> float:
        """The lower end of its remembered interval: what recalled kernels rank by."""
        return (self.speedup_ci or (self.speedup or 0.0,))[0]


class RecalledNote(BaseModel):
    id: str
    score: float
    outcome: str
    text: str


class Recall(BusMessage):
    kernels: list[RecalledKernel] = Field(default_factory=list)
    notes: list[RecalledNote] = Field(default_factory=list)


class Note(BusMessage):
    text: str
    outcome: Literal["worked", "failed", "info"] = "info"
    target: str | None = None


class TokenUsage(BusMessage):
    actor: str
    model: str
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float = 0.0
    session_tokens: int = 0
    session_cost_usd: float = 0.0


class ActorRestarted(BusMessage):
    actor: str
    error: str
    redelivered: str = Field(description="type of the in-flight message handed to the fresh actor")


class ActorFailed(BusMessage):
    actor: str
    error: str
    message_type: str
    message: dict[str, Any] = Field(default_factory=dict)


class SessionFinished(BusMessage):
    status: Literal["scored", "failed", "budget", "error"]
    reason: str = ""
    best: CandidateScored | None = None


class HumanPrompt(BusMessage):
    """A question put to the person in a HITL session (a plan, a kernel or a fix to approve)."""

    question: str
    subject: dict[str, Any] = Field(default_factory=dict)
    options: list[str] = Field(default_factory=lambda: ["approve", "edit", "redirect", "stop"])


class HumanDecision(BusMessage):
    decision: Literal["approve", "edit", "redirect", "stop"]
    text: str = ""
    edited_source: str | None = None


class Ping(BaseModel):
    """Benchmark probe: echoed back by the echo actor."""

    n: int
    sent_ns: int
    payload: str = ""


ALL_MESSAGES: tuple[type[BaseModel], ...] = (
    OptimizeRequest, Plan, KernelDraft, EvalRequest, EvalReport, FixRequest, DraftAbandoned, ProfileReport,
    TuneReport, CandidateScored, RecallRequest, Recall, Note, TokenUsage, ActorRestarted,
    ActorFailed, SessionFinished, HumanPrompt, HumanDecision, Ping,
)

_BY_NAME: dict[str, type[BaseModel]] = {cls.__name__: cls for cls in ALL_MESSAGES}


def message_from_event(message_type: str, payload: dict[str, Any]) -> BaseModel:
    """A persisted message rebuilt from its class name and JSON form (how the event log stores it)."""
    cls = _BY_NAME.get(message_type)
    if cls is None:
        raise ValueError(f"unknown message type {message_type!r}")
    return cls.model_validate(payload)
