"""GPU lowering validation without a GPU: ``jax.export(..., platforms=["cuda"])`` runs Pallas lowering through
Mosaic GPU or Triton on this machine (with the optional CUDA plugin, ``pip install -e ".[gpu]"``) and rejects
what the backend rejects (Triton: block shapes that are not powers of two; Mosaic GPU: copies off its
alignment). Lowering does not depend on the chip, so the chip's own limits are checked here from the block
shapes: the backend must run on the chip (Mosaic GPU needs Hopper or later) and one program instance must fit
in its shared memory.
"""

from __future__ import annotations

import importlib.util
import time
from functools import partial
from typing import Any, Literal

import jax
from pydantic import BaseModel, Field

from jaxbench.task import Task
from jaxbench.task_check import full_shapes
from maxkernel.targets.gpu_blocks import SmemBudgetError, check_smem
from maxkernel.targets.gpu_spec import GpuSpec, load_gpu_spec
from maxkernel.targets.jaxpr_walk import find_pallas_calls
from maxkernel.targets.loader import CandidateLoadError, candidate_filename, eqn_line, load_candidate
from maxkernel.targets.lowering import _candidate_line, _kernel_line, _verbose_pallas_errors
from maxkernel.targets.names import TargetError

GpuStage = Literal["plugin", "load", "trace", "lowering", "backend", "smem"]
PLUGIN_MODULE = "jax_plugins.xla_cuda12"
# Triton kernels lower to a custom call that jax.export will not serialize; lowering itself is the check.
_TRITON_CALL = "__gpu$xla.gpu.triton"
MOSAIC_MIN_CAPABILITY = 9.0


class GpuLoweringResult(BaseModel):
    """Whether a candidate lowers for one GPU chip, and if not, what and where."""

    ok: bool
    target: str
    chip: str
    stage: GpuStage | None = None
    reason: str = Field(default="", description="one line fit for EvalReport.reason")
    error: str = ""
    error_type: str = ""
    line: int | None = None
    line_text: str | None = None
    pallas_calls: int = 0
    backends: list[str] = Field(default_factory=list, description="backend of each pallas_call")
    smem_bytes: int | None = Field(default=None, description="largest per-block shared memory")
    smem_budget_bytes: int | None = None
    duration_s: float = 0.0


def plugin_available() -> bool:
    """Whether the CUDA PJRT plugin that lowers for GPU is installed (on a machine that never had one,
    even the ``jax_plugins`` namespace it lives in is missing)."""
    try:
        return importlib.util.find_spec(PLUGIN_MODULE) is not None
    except ModuleNotFoundError:
        return False


PLUGIN_FIX = 'pip install -e ".[gpu]"'


def require_plugin(target: str) -> None:
    """Refuse a ``gpu-<chip>`` target up front where the plugin that lowers for it is missing: without it
    every candidate would be rejected, one by one, after the run had started."""
    if not plugin_available():
        raise TargetError(f"--target {target}: lowering for GPU needs the optional CUDA plugin; install it with "
                          f"{PLUGIN_FIX}")


def export_for_gpu(fn: Any, *arg_shapes: Any) -> Any:
    """``jax.export`` for CUDA, allowing Triton's custom call (lowering is what is checked, not serialization)."""
    checks = [jax.export.DisabledSafetyCheck.custom_call(_TRITON_CALL)]
    return jax.export.export(fn, platforms=["cuda"], disabled_checks=checks)(*arg_shapes)


def validate_gpu(candidate_source: str, task: Task, chip: str) -> GpuLoweringResult:
    """Lower the candidate's ``kernel`` for GPU ``chip`` at the task's ``full`` size, without a GPU."""
    start = time.perf_counter()
    spec = load_gpu_spec(chip)
    filename = candidate_filename(candidate_source)
    lines = candidate_source.splitlines()

    def fail(stage: GpuStage, exc: BaseException | str, line: int | None, **extra: Any) -> GpuLoweringResult:
        if isinstance(exc, BaseException):
            exc = _backend_error(exc)
        message = str(exc).strip()
        kind = type(exc).__name__ if isinstance(exc, BaseException) else "TargetError"
        summary = next((ln.strip() for ln in message.splitlines() if ln.strip()), kind)
        summary = summary if len(summary) <= 300 else summary[:297] + "..."
        text = lines[line - 1].strip() if line and 0 < line <= len(lines) else None
        reason = f"{spec.target} {stage} failed: {kind}: {summary}"
        if text and f"candidate line {line}" not in summary:
            reason += f"; candidate line {line}: {text}"
        return GpuLoweringResult(ok=False, target=spec.target, chip=spec.name, stage=stage, reason=reason,
                                 error=message[:4000], error_type=kind, line=line, line_text=text,
                                 duration_s=time.perf_counter() - start, **extra)

    if not plugin_available():
        return fail("plugin", f"lowering for GPU needs the CUDA plugin: {PLUGIN_FIX}", None)
    try:
        module = load_candidate(candidate_source)
    except CandidateLoadError as exc:
        return fail("load", exc, exc.line)
    arg_shapes, static, _ = full_shapes(task, "full")
    fn = jax.jit(partial(module.kernel, **static))
    try:
        traced = fn.trace(*arg_shapes)
    except Exception as exc:
        return fail("trace", exc, _candidate_line(exc, filename))
    jaxpr = traced.jaxpr.jaxpr
    calls = find_pallas_calls(jaxpr)
    try:
        with _verbose_pallas_errors():
            export_for_gpu(fn, *arg_shapes)
    except Exception as exc:
        line = _candidate_line(exc, filename) or _kernel_line(str(exc), jaxpr, filename)
        return fail("lowering", exc, line, pallas_calls=len(calls))
    return _check_chip(calls, spec, filename, fail, start)


def _backend_error(exc: BaseException) -> BaseException:
    """The backend's own error under Pallas's "Exception while lowering eqn" wrapper (its deepest cause)."""
    while str(exc).lstrip().startswith("Exception while lowering") and exc.__cause__ is not None:
        exc = exc.__cause__
    return exc


def _check_chip(calls: list[Any], spec: GpuSpec, filename: str, fail: Any, start: float) -> GpuLoweringResult:
    """What lowering cannot see: the backend's fit to the chip and each program instance's shared memory."""
    largest, backends = None, []
    for call in calls:
        line = eqn_line(call.eqn, filename)
        try:
            shape = check_smem(call.eqn, call.name, spec)
        except SmemBudgetError as exc:
            return fail("smem", exc, line, pallas_calls=len(calls), smem_bytes=exc.smem_bytes,
                        smem_budget_bytes=exc.budget_bytes)
        if shape.backend == "mosaic" and float(spec.compute_capability) < MOSAIC_MIN_CAPABILITY:
            return fail("backend", f"kernel {call.name} lowers through Mosaic GPU, which needs compute "
                        f"capability {MOSAIC_MIN_CAPABILITY} or later; {spec.target} is "
                        f"{spec.compute_capability}: give it Triton's CompilerParams", line,
                        pallas_calls=len(calls))
        backends.append(shape.backend)
        largest = shape.smem_bytes if largest is None else max(largest, shape.smem_bytes)
    return GpuLoweringResult(ok=True, target=spec.target, chip=spec.name, pallas_calls=len(calls),
                             backends=backends, smem_bytes=largest,
                             smem_budget_bytes=spec.smem_per_block if calls else None,
                             duration_s=time.perf_counter() - start)
