"""TPU lowering validation without a TPU: ``jax.export(..., platforms=["tpu"])`` runs Pallas->Mosaic lowering
on this machine and rejects what Mosaic rejects (block shapes off the 8x128 tiling, unsupported ops, dtypes
the chip's MXU lacks); the VMEM each kernel needs is then checked against the generation's budget. With
``MAXKERNEL_TPU_COMPILE=1`` and the TPU compiler installed (the ``tpu-compiler`` extra), the program is
also compiled by XLA:TPU and Mosaic for the generation's topology, as on the chip itself: that refuses
what lowering lets through (a dynamic offset along a tiled dimension Mosaic cannot prove aligned). It is
opt-in because it costs 0.2-40 s a candidate on a 2-core host.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any, Literal

import jax
from jax._src import core
from pydantic import BaseModel, Field

from jaxbench.task import Task
from jaxbench.task_check import full_shapes
from maxkernel.targets.blocks import VmemBudgetError, check_vmem
from maxkernel.targets.device import tpu_device
from maxkernel.targets.jaxpr_walk import find_pallas_calls, sub_jaxprs
from maxkernel.targets.loader import CandidateLoadError, candidate_filename, eqn_line, load_candidate
from maxkernel.targets.specs import load_tpu_spec

Stage = Literal["load", "trace", "lowering", "compile", "vmem"]

_BLOCK_SPEC = re.compile(r"Block spec for (?P<origin>.+?) in pallas_call .*? has block shape "
                         r"\((?P<shape>.*?)\), array shape")
_BLOCK_DIM = re.compile(r"(\w+)\(([^()]*)\)")
_SRC_AT = re.compile(r" at (?P<file>.+):(?P<line>\d+)$")
_UNIMPLEMENTED = re.compile(r"Unimplemented primitive in Pallas TPU lowering for \w+: (\w+)")


class LoweringResult(BaseModel):
    """Whether a candidate lowers for one TPU generation, and if not, what and where."""

    ok: bool
    target: str
    generation: str
    stage: Stage | None = Field(default=None, description="where it failed: load, trace, lowering, compile or vmem")
    reason: str = Field(default="", description="one line fit for EvalReport.reason")
    error: str = Field(default="", description="the error message, trimmed")
    error_type: str = ""
    line: int | None = Field(default=None, description="1-based line of the candidate source")
    line_text: str | None = None
    block_shape: str | None = Field(default=None, description="offending block shape, e.g. '(7, 7)'")
    operand: str | None = Field(default=None, description="operand of that block shape, e.g. 'args[0]'")
    pallas_calls: int = 0
    vmem_bytes: int | None = Field(default=None, description="largest kernel VMEM footprint")
    vmem_budget_bytes: int | None = None
    compiled: bool = Field(default=False, description="compiled by XLA:TPU and Mosaic too (the TPU compiler is installed)")
    duration_s: float = 0.0


def validate_tpu(candidate_source: str, task: Task, generation: str) -> LoweringResult:
    """Lower the candidate's ``kernel`` for TPU ``generation`` at the task's ``full`` size, without a TPU."""
    start = time.perf_counter()
    spec = load_tpu_spec(generation)
    filename = candidate_filename(candidate_source)
    lines = candidate_source.splitlines()

    def fail(stage: Stage, exc: BaseException, line: int | None, **extra: Any) -> LoweringResult:
        message = str(exc).strip()
        summary = next((ln.strip() for ln in message.splitlines() if ln.strip()), type(exc).__name__)
        if len(summary) > 300 and ". " in summary[:300]:
            summary = summary[: summary.index(". ") + 1]  # Mosaic packs details after the first sentence
        summary = summary if len(summary) <= 300 else summary[:297] + "..."
        text = lines[line - 1].strip() if line and 0 < line <= len(lines) else None
        reason = f"{spec.target} {stage} failed: {type(exc).__name__}: {summary}"
        if extra.get("block_shape"):
            reason += f"; block shape {extra['block_shape']} of {extra.get('operand') or 'an operand'}"
        if text and f"candidate line {line}" not in summary:
            reason += f"; candidate line {line}: {text}"
        return LoweringResult(
            ok=False, target=spec.target, generation=spec.name, stage=stage, reason=reason,
            error=message[:4000], error_type=type(exc).__name__, line=line, line_text=text,
            duration_s=time.perf_counter() - start, **extra)

    try:
        module = load_candidate(candidate_source)
    except CandidateLoadError as exc:
        return fail("load", exc, exc.line)
    arg_shapes, static, _ = full_shapes(task, "full")
    fn = jax.jit(partial(module.kernel, **static))
    with tpu_device(spec):
        try:
            traced = fn.trace(*arg_shapes)
        except Exception as exc:
            return fail("trace", exc, _candidate_line(exc, filename))
        try:
            with _verbose_pallas_errors():
                jax.export.export(fn, platforms=["tpu"])(*arg_shapes)
        except Exception as exc:
            jaxpr = traced.jaxpr.jaxpr
            located = _locate_block(str(exc), jaxpr, filename)
            line = (located.pop("line", None) or _candidate_line(exc, filename)
                    or _kernel_line(str(exc), jaxpr, filename))
            return fail("lowering", exc, line, pallas_calls=len(find_pallas_calls(jaxpr)), **located)
        try:
            compiled = compile_for_tpu(fn, arg_shapes, spec.name)
        except Exception as exc:
            return fail("compile", exc, _candidate_line(exc, filename) or _kernel_line(str(exc), traced.jaxpr.jaxpr, filename),
                        pallas_calls=len(find_pallas_calls(traced.jaxpr.jaxpr)))

    calls = find_pallas_calls(traced.jaxpr.jaxpr)
    largest, budget_of_largest = None, None
    for call in calls:
        try:
            used, budget = check_vmem(call.eqn, call.name, spec)
        except VmemBudgetError as exc:
            return fail("vmem", exc, eqn_line(call.eqn, filename), pallas_calls=len(calls),
                        vmem_bytes=exc.vmem_bytes, vmem_budget_bytes=exc.budget_bytes)
        if largest is None or used > largest:
            largest, budget_of_largest = used, budget
    return LoweringResult(ok=True, target=spec.target, generation=spec.name, pallas_calls=len(calls),
                          vmem_bytes=largest, vmem_budget_bytes=budget_of_largest, compiled=compiled,
                          duration_s=time.perf_counter() - start)


def compile_for_tpu(fn: Any, arg_shapes: Any, generation: str) -> bool:
    """Compile ``fn`` at ``arg_shapes`` with XLA:TPU and Mosaic for ``generation``'s topology; False (nothing
    done) unless ``MAXKERNEL_TPU_COMPILE=1`` and the TPU compiler is installed. Raises what the compiler
    raises."""
    from maxkernel.targets.xla_tpu import tpu_compiler

    if os.environ.get("MAXKERNEL_TPU_COMPILE", "0").strip() not in ("1", "true", "on"):
        return False
    device = tpu_compiler(generation)
    if device is None:
        return False
    sharding = jax.sharding.SingleDeviceSharding(device)
    placed = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), arg_shapes)
    fn.lower(*placed).compile()
    return True


@contextmanager
def _verbose_pallas_errors() -> Iterator[None]:
    """Have Mosaic name the failing kernel equation and attach its traceback (a process-wide flag: restored)."""
    before = jax.config.read("jax_pallas_verbose_errors")
    jax.config.update("jax_pallas_verbose_errors", True)
    try:
        yield
    finally:
        jax.config.update("jax_pallas_verbose_errors", before)


def _kernel_line(message: str, jaxpr: core.Jaxpr, filename: str) -> int | None:
    """Fallback location: the first kernel equation of a primitive Mosaic says it cannot lower, else the
    first pallas_call of the candidate."""
    calls = find_pallas_calls(jaxpr)
    match = _UNIMPLEMENTED.search(message)
    if match:
        for call in calls:
            for eqn in _kernel_eqns(call.eqn.params["jaxpr"]):
                if eqn.primitive.name == match.group(1):
                    line = eqn_line(eqn, filename)
                    if line is not None:
                        return line
    return next((ln for call in calls if (ln := eqn_line(call.eqn, filename)) is not None), None)


def _kernel_eqns(jaxpr: core.Jaxpr) -> Iterator[core.JaxprEqn]:
    for eqn in jaxpr.eqns:
        yield eqn
        for _, sub in sub_jaxprs(eqn):
            yield from _kernel_eqns(sub)


def _candidate_line(exc: BaseException, filename: str) -> int | None:
    """Deepest candidate frame of the first exception in the chain that passed through the candidate.

    Lowering runs after tracing, so a lowering error's own frames are JAX's; the candidate's frames come
    from the traceback Mosaic attaches for the failing kernel equation (verbose Pallas errors) or from the
    tracing call JAX chains as the cause (``JaxStackTraceBeforeTransformation``).
    """
    pending, seen = [exc], set()
    while pending:
        current = pending.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        found = None
        tb = current.__traceback__
        while tb is not None:
            if tb.tb_frame.f_code.co_filename == filename:
                found = tb.tb_lineno
            tb = tb.tb_next
        if found is not None:
            return found
        pending.extend(e for e in (current.__cause__, current.__context__) if e is not None)
    return None


def _shape_text(dims: str) -> str:
    sizes = []
    for _, inner in _BLOCK_DIM.findall(dims):
        number = re.search(r"\d+", inner)
        sizes.append(number.group(0) if number else "None")
    return "(" + ", ".join(sizes) + ("," if len(sizes) == 1 else "") + ")"


def _locate_block(message: str, jaxpr: core.Jaxpr, filename: str) -> dict[str, Any]:
    """Block shape and operand named by a Mosaic BlockSpec error, and the line of that BlockSpec's index map."""
    match = _BLOCK_SPEC.search(message)
    if not match:
        return {}
    origin, shape = match.group("origin"), _shape_text(match.group("shape"))
    found: dict[str, Any] = {"block_shape": shape, "operand": origin}
    for call in find_pallas_calls(jaxpr):
        for bm in call.eqn.params["grid_mapping"].block_mappings:
            if str(bm.origin) != origin or _shape_text(", ".join(map(repr, bm.block_shape))) != shape:
                continue
            debug = bm.index_map_jaxpr.jaxpr.debug_info
            where = _SRC_AT.search(getattr(debug, "func_src_info", "") or "")
            if where and where.group("file") == filename:
                found["line"] = int(where.group("line"))
                return found
    return found
