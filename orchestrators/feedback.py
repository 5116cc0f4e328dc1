"""What an iteration taught: per strategy, how its drafts fared, in words a planner or a person can use."""

from __future__ import annotations

from pydantic import BaseModel, Field

from jaxbench.report import EvalReport as JudgeReport, format_speedup

from maxkernel.messages import (
    BusMessage,
    CandidateScored,
    DraftAbandoned,
    EvalReport,
    FixRequest,
    KernelDraft,
    TuneReport,
)


class Attempt(BaseModel):
    """One strategy's outcome within one iteration."""

    strategy: str
    step: int
    evaluations: int = 0
    status: str = "untried"
    reason: str = ""
    speedup: float | None = None
    speedup_ci: tuple[float, float] | None = Field(None, description="the interval of the reading kept: the one "
                                                                     "with the highest lower end")
    tuned_params: dict = Field(default_factory=dict)

    @property
    def low(self) -> float:
        interval = self.speedup_ci or ((self.speedup, self.speedup) if self.speedup is not None else None)
        return interval[0] if interval else 0.0

    def keep(self, report: JudgeReport) -> bool:
        """Keep ``report``'s reading when its lower end is the highest so far; True when it was kept."""
        if not report.passed or (self.speedup is not None and report.low <= self.low):
            return False
        self.speedup, self.speedup_ci = report.speedup, report.interval
        return True

    def line(self) -> str:
        if self.status == "ok":
            tuned = f" tuned to {self.tuned_params}" if self.tuned_params else ""
            speed = format_speedup(self.speedup, self.speedup_ci)
            return f"{self.strategy}: correct, {speed}{tuned} ({self.evaluations} evaluation{'' if self.evaluations == 1 else 's'})"
        return f"{self.strategy}: {self.status} — {self.reason[:240]} ({self.evaluations} evaluation{'' if self.evaluations == 1 else 's'})"


def attempts(messages: list[BusMessage]) -> list[Attempt]:
    """Fold an iteration's messages into one ``Attempt`` per strategy, in the order they were worked on."""
    out: dict[str, Attempt] = {}

    def get(name: str, step: int) -> Attempt:
        if name not in out:
            out[name] = Attempt(strategy=name, step=step)
        return out[name]

    for message in messages:
        if isinstance(message, KernelDraft):
            get(message.plan.current.name, message.plan.step)
        elif isinstance(message, (EvalReport, FixRequest)):
            plan = message.draft.plan
            attempt = get(plan.current.name, plan.step)
            attempt.evaluations += 1
            report = message.report
            if attempt.keep(report):
                attempt.status, attempt.reason = "ok", ""
            elif attempt.status != "ok" and not report.passed:
                attempt.status, attempt.reason = report.status, report.reason
        elif isinstance(message, DraftAbandoned):
            attempt = get(message.plan.current.name, message.plan.step)
            if attempt.status != "ok":
                attempt.status = "abandoned" if attempt.status == "untried" else attempt.status
                attempt.reason = message.reason
        elif isinstance(message, TuneReport):
            attempt = out.get(message.strategy)
            if attempt is not None and message.best_report.passed:
                attempt.tuned_params = message.best_params
                attempt.keep(message.best_report)
    return sorted(out.values(), key=lambda a: a.step)


def scored(messages: list[BusMessage]) -> CandidateScored | None:
    return next((m for m in reversed(messages) if isinstance(m, CandidateScored)), None)


def feedback_text(history: list[Attempt]) -> str:
    """The notes handed to the coder (and a person) before the next iteration."""
    if not history:
        return ""
    return "## Tried so far\n" + "\n".join(f"- {a.line()}" for a in history)
