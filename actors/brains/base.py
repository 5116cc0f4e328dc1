"""What a brain must answer, and the tools an actor lends it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from jaxbench.report import EvalReport as JudgeReport
from jaxbench.task import Task
from maxkernel.messages import (
    EvalReport,
    FixRequest,
    OptimizeRequest,
    Plan,
    ProfileReport,
    Recall,
    StrategyRef,
    TuneTrial,
)


class UnusableReply(ValueError):
    """The model never produced a usable answer, even after being told why."""


@dataclass
class Tools:
    """The actor's hands, lent to its brain: the task, the evaluator (through the tester) and memory."""

    task: Task
    target: str
    size: str
    evaluate: Callable[[str, bool], Awaitable[JudgeReport]]
    recall: Callable[[], Awaitable[Recall]]


@dataclass
class PlanOutcome:
    analysis: str
    strategies: list[StrategyRef]
    notes: str = ""


@dataclass
class Diagnosis:
    bound: str
    diagnosis: str
    suggestions: list[str] = field(default_factory=list)


@dataclass
class TuneOutcome:
    best_source: str
    best_report: JudgeReport
    best_params: dict[str, Any] = field(default_factory=dict)
    trials: list[TuneTrial] = field(default_factory=list)


@dataclass
class FixedDraft:
    """A fix that changes the strategy's parameters, not only its source: the plan is sent on with them."""

    source: str
    params: dict[str, Any]
    why: str


class Brain(ABC):
    def __init__(self, role: str, services: Any, tools: Tools) -> None:
        self.role, self.services, self.tools = role, services, tools

    @abstractmethod
    async def plan(self, request: OptimizeRequest, recall: Recall) -> PlanOutcome: ...

    @abstractmethod
    async def draft(self, plan: Plan, feedback: str | None = None) -> str:
        """A candidate for the plan's current strategy; ``feedback`` says why the previous one was dropped."""

    @abstractmethod
    async def fix(self, request: FixRequest) -> "str | FixedDraft | None":
        """A fixed source (with new parameters: a :class:`FixedDraft`), or None to give the strategy up."""

    @abstractmethod
    async def profile(self, report: EvalReport) -> Diagnosis: ...

    @abstractmethod
    async def tune(self, profile: ProfileReport) -> TuneOutcome: ...
