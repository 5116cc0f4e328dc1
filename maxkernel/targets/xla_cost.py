"""Plain-JAX work (references, non-Pallas candidates, the glue around kernels) priced from XLA.

Approximation, stated once: HBM bytes are the "bytes accessed" of XLA's cost analysis of the program
compiled for *this CPU* (``jax.jit(f).lower(*shapes).compile().cost_analysis()``), i.e. after CPU fusion;
XLA:TPU fuses differently and may keep a bf16 matmul's operands in bf16 where the CPU widens them, so bytes
are indicative, not exact. Loop bodies are counted once by XLA. Work (MXU/VPU/EUP) is counted from the jaxpr
with the same rules as kernel bodies (``maxkernel.targets.ops``), because the CPU's flop count expands some
ops (``ragged_dot`` becomes one dense matmul per group); XLA's own figure is kept for reference.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
from jax._src import core

from maxkernel.targets.interpret import evaluate
from maxkernel.targets.jaxpr_walk import PallasCall
from maxkernel.targets.ops import OpCounts, count_ops


@dataclass
class XlaCost:
    bytes: float
    counts: OpCounts
    xla_flops: float


def _cost_analysis(traced: Any) -> tuple[float, float]:
    analysis = traced.lower().compile().cost_analysis()
    if isinstance(analysis, (list, tuple)):
        analysis = analysis[0] if analysis else {}
    analysis = analysis or {}
    return float(analysis.get("bytes accessed", 0.0)), float(analysis.get("flops", 0.0))


def xla_cost(fn: Callable[..., Any], arg_shapes: Sequence[Any]) -> XlaCost:
    """Bytes and work of ``fn`` (plain JAX) at the given abstract argument shapes."""
    traced = jax.jit(fn).trace(*arg_shapes)
    nbytes, xla_flops = _cost_analysis(traced)
    return XlaCost(nbytes, count_ops(traced.jaxpr.jaxpr), xla_flops)


LAYOUT_ONLY = ("reshape", "squeeze", "expand_dims")


def glue_cost(closed: core.ClosedJaxpr, calls: list[PallasCall]) -> XlaCost | None:
    """Bytes and work of everything outside the pallas_calls, or None when a kernel sits inside a loop.

    The program is re-traced with each kernel's outputs turned into inputs and each kernel's computed
    operands turned into outputs, so XLA prices exactly the surrounding code.
    """
    if any(call.in_control_flow for call in calls):
        return None
    kernel_outs = [[jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in call.eqn.outvars] for call in calls]
    arg_shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in closed.in_avals]

    def glue(args: list[Any], pallas_outs: list[list[Any]]) -> list[Any]:
        sources = {id(x) for x in jax.tree_util.tree_leaves((args, pallas_outs))}
        results = iter(pallas_outs)
        kept: dict[int, Any] = {}

        def on_layout(eqn: core.JaxprEqn, invals: list[Any]) -> list[Any]:
            # A reshape of a program input or kernel output is a bitcast on TPU: it moves no bytes,
            # so its result counts as the same buffer rather than as a new one to price.
            params = eqn.primitive.get_bind_params(eqn.params)
            out = eqn.primitive.bind(*invals, **params)
            if id(invals[0]) in sources:
                sources.add(id(out))
            return [out]

        def keep(values: Sequence[Any]) -> None:
            for value in values:
                if isinstance(value, jax.core.Tracer) and id(value) not in sources:
                    kept.setdefault(id(value), value)

        def on_pallas(eqn: core.JaxprEqn, invals: list[Any]) -> list[Any]:
            keep(invals)
            return list(next(results))

        hooks = {"pallas_call": on_pallas, **{name: on_layout for name in LAYOUT_ONLY}}
        keep(evaluate(closed.jaxpr, closed.consts, args, hooks))
        return list(kept.values())

    traced = jax.jit(glue).trace(arg_shapes, kernel_outs)
    if not traced.jaxpr.jaxpr.eqns:
        return XlaCost(0.0, OpCounts(), 0.0)
    nbytes, xla_flops = _cost_analysis(traced)
    return XlaCost(nbytes, count_ops(traced.jaxpr.jaxpr), xla_flops)
