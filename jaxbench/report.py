"""The evaluation report: the one record of how a candidate fared, shared by every part of MaxKernel."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

Status = Literal["ok", "compile_error", "runtime_error", "incorrect", "timeout", "rejected"]
Basis = Literal["measured", "modelled"]
Label = Literal["pallas-kernel", "jax", "reference-equivalent"]


class CheckResult(BaseModel):
    """One integrity or correctness check and its verdict."""

    name: str
    passed: bool
    detail: str = ""


class SpeedupInterval:
    """``interval`` and ``low`` for anything with ``speedup``, ``speedup_ci`` and ``passed`` (a report, a
    search node)."""

    @property
    def interval(self) -> tuple[float, float] | None:
        """The speedup's interval: the measured one, else the point (modelled, or a report without one)."""
        speedup, ci = getattr(self, "speedup"), getattr(self, "speedup_ci")
        if speedup is None:
            return None
        return tuple(ci) if ci else (speedup, speedup)  # type: ignore[return-value]

    @property
    def low(self) -> float:
        """The interval's lower end (0.0 when it failed or has none): what ranking goes by, so luck never wins."""
        interval = self.interval if getattr(self, "passed") else None
        return interval[0] if interval else 0.0


class EvalReport(SpeedupInterval, BaseModel):
    task: str
    target: str = "cpu"
    size: str = "cpu"
    status: Status
    reason: str = ""
    correct: bool = False
    max_abs_err: float | None = None
    ref_ms: float | None = None
    kernel_ms: float | None = None
    speedup: float | None = None
    speedup_ci: tuple[float, float] | None = Field(
        default=None, description="95% bootstrap interval of a measured speedup over the timing rounds; a modelled "
                                  "speedup is deterministic and its interval is the point itself")
    cv: float | None = Field(default=None, description="coefficient of variation of the kernel's timings")
    ref_cv: float | None = None
    basis: Basis | None = Field(default=None, description="whether ref_ms/kernel_ms were measured or modelled")
    label: Label | None = Field(default=None, description="what the candidate is: a Pallas kernel, plain JAX, or the reference itself")
    checks: list[CheckResult] = Field(default_factory=list)
    flags: list[str] = Field(default_factory=list, description="warnings that do not fail the candidate")
    ref_flops: float | None = None
    kernel_flops: float | None = None
    ref_bytes: float | None = None
    kernel_bytes: float | None = None
    model: dict[str, Any] | None = Field(default=None, description="cost-model figures for a modelled target")
    timing_calls: int | None = Field(default=None, description="timed calls per round on each side (alike for both)")
    judge_cpu_ms: float | None = Field(default=None, description="CPU time the judge's own process spent while the "
                                       "timing rounds ran: work that competed with the timed calls")
    candidate_sha: str = ""
    duration_s: float = 0.0

    @property
    def passed(self) -> bool:
        """Fit to be remembered: evaluated ok and correct."""
        return self.status == "ok" and self.correct

    def check(self, name: str) -> CheckResult | None:
        return next((c for c in self.checks if c.name == name), None)


def format_interval(interval: tuple[float, float] | list[float] | None) -> str:
    """``1.02–1.09x``: the same precision everywhere a speedup is shown."""
    if not interval:
        return "-"
    low, high = interval
    return f"{low:.2f}x" if round(low, 2) == round(high, 2) else f"{low:.2f}–{high:.2f}x"


def format_speedup(speedup: float | None, interval: tuple[float, float] | list[float] | None = None) -> str:
    """``1.05x (1.02–1.09x)``: a speedup with its interval where it has one."""
    if speedup is None:
        return "-"
    if not interval or round(interval[0], 2) == round(interval[1], 2):
        return f"{speedup:.2f}x"
    return f"{speedup:.2f}x ({format_interval(interval)})"
