"""Every evaluation of a session as one row of a trial table, read from its bus messages.

A row says which strategy was judged, in which role (the baseline run of the reference, a draft, a fix,
a tuning trial, a confirmation run), at which parameters, and what the judge said.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from actors.policy import BASELINE, CONFIRM
from maxkernel.messages import BusMessage, EvalReport, FixRequest, TuneReport

Role = Literal["baseline", "draft", "fix", "tune", "confirm", "tool"]


class TrialRow(BaseModel):
    strategy: str
    role: Role
    params: dict[str, Any] = Field(default_factory=dict)
    status: str
    speedup: float | None = None
    speedup_ci: tuple[float, float] | None = None
    kernel_ms: float | None = None
    label: str | None = None
    basis: str | None = None
    reason: str = ""
    seconds: float = 0.0
    candidate_sha: str = Field("", description="the judged code's hash: a re-measurement has its candidate's")


def role_of(produced_by: str) -> Role:
    if produced_by == BASELINE:
        return "baseline"
    if produced_by == CONFIRM:
        return "confirm"
    if produced_by.startswith("tuner:"):
        return "tune"
    if produced_by.endswith(":tool"):
        return "tool"
    if produced_by.startswith("debugger:"):
        return "fix"
    return "draft"


def trial_row(message: BusMessage) -> TrialRow | None:
    """The row of one evaluation message (None for any other message)."""
    if not isinstance(message, (EvalReport, FixRequest)):
        return None
    draft, report = message.draft, message.report
    role = role_of(draft.produced_by)
    params = {k: v for k, v in draft.plan.current.params.items() if k not in ("source", "rewrites")}
    return TrialRow(strategy=draft.plan.current.name, role=role, params=params if role in ("draft", "fix") else {},
                    status=report.status, speedup=report.speedup, speedup_ci=report.interval, kernel_ms=report.kernel_ms, label=report.label,
                    basis=report.basis, reason=report.reason[:200], seconds=report.duration_s,
                    candidate_sha=report.candidate_sha)


def trial_rows(messages: list[BusMessage]) -> list[TrialRow]:
    """Every evaluation in order; tuning trials get their parameters from the tuner's report."""
    rows: list[TrialRow] = []
    for message in messages:
        row = trial_row(message)
        if row is not None:
            rows.append(row)
        elif isinstance(message, TuneReport):
            pending = [r for r in rows if r.role == "tune" and r.strategy == message.strategy and not r.params]
            for trial in message.trials:
                match = next((r for r in pending if r.kernel_ms == trial.kernel_ms and r.speedup == trial.speedup
                              and r.status == trial.status), None)
                if match is not None:
                    match.params = {k: v for k, v in trial.params.items() if k != "rewrites"}
                    pending.remove(match)
    return rows
