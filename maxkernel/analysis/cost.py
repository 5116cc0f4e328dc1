"""FLOPs, bytes and the roofline bound of a reference, from XLA's own cost analysis.

XLA counts after fusion on this CPU, so bytes are what the compiled reference actually moves; on a TPU
target the bound compares the arithmetic intensity with that generation's machine balance.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Literal

import jax

from maxkernel.analysis.program import input_shapes, static_args

if TYPE_CHECKING:
    from jaxbench.task import Task

# A 2-core x86 host: ~100 GFLOP/s f32 against ~10 GB/s of DRAM bandwidth seen by one process.
CPU_BALANCE_FLOP_PER_BYTE = 10.0


def xla_cost(task: "Task", size: str) -> tuple[float, float]:
    """(flops, bytes accessed) of the compiled reference at ``size``."""
    fn = functools.partial(task.reference, **static_args(task, size))
    compiled = jax.jit(fn).lower(*input_shapes(task, size)).compile()
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else {}
    cost = cost or {}
    return float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0))


def machine_balance(target: str) -> float:
    """FLOPs per byte at which the target turns from memory- to compute-bound."""
    from maxkernel.targets.names import parse_target

    kind, generation = parse_target(target)
    if kind == "tpu" and generation is not None:
        from maxkernel.targets.specs import load_tpu_spec

        spec = load_tpu_spec(generation)
        return spec.peak_f32_flops / spec.hbm_bandwidth
    return CPU_BALANCE_FLOP_PER_BYTE


def bound(intensity: float, target: str) -> Literal["compute", "memory"]:
    return "compute" if intensity >= machine_balance(target) else "memory"
