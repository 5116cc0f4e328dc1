"""What an iteration taught: per strategy, how its drafts fared, in words a planner or a person can use."""

from __future__ import annotations

from pydantic import BaseModel, Field

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
    tuned_params: dict = Field(default_factory=dict)

    def line(self) -> str:
        if self.status == "ok":
            tuned = f" tuned to {self.tuned_params}" if self.tuned_params else ""
            return f"{self.strategy}: correct, {self.speedup}x{tuned} ({self.evaluations} evaluations)"
        return f"{self.strategy}: {self.status} — {self.reason[:240]} ({self.evaluations} evaluations)"


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
            if report.passed and (attempt.speedup is None or (report.speedup or 0) > attempt.speedup):
                attempt.status, attempt.speedup, attempt.reason = "ok", report.speedup, ""
            elif attempt.status != "ok":
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
                attempt.speedup = max(attempt.speedup or 0.0, message.best_report.speedup or 0.0)
    return sorted(out.values(), key=lambda a: a.step)


def scored(messages: list[BusMessage]) -> CandidateScored | None:
    return next((m for m in reversed(messages) if isinstance(m, CandidateScored)), None)


def feedback_text(history: list[Attempt]) -> str:
    """The notes handed to the coder (and a person) before the next iteration."""
    if not history:
        return ""
    return "## Tried so far\n" + "\n".join(f"- {a.line()}" for a in history)
