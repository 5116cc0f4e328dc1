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


class EvalReport(BaseModel):
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
    candidate_sha: str = ""
    duration_s: float = 0.0

    @property
    def passed(self) -> bool:
        """Fit to be remembered: evaluated ok and correct."""
        return self.status == "ok" and self.correct

    def check(self, name: str) -> CheckResult | None:
        return next((c for c in self.checks if c.name == name), None)
