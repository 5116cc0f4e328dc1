"""The check size: the smallest task size at which a candidate still runs the code it is priced for at
``full``, so that correctness (TPU interpret mode on a CPU) is proven on the priced code.

Starting from ``full``, each integer size parameter is halved while the candidate traced there stays a twin
of its ``full`` trace (:mod:`maxkernel.targets.twins`: the same kernels, bodies, block shapes and XLA code,
at least two grid steps along each axis that has two or more at ``full``, at least two trips of each static
loop that makes two or more); a parameter is never taken below its ``cpu`` value (the smallest size the
task is known to work at), and the ``cpu`` size itself is used when it is a twin. A candidate that runs
other code at smaller sizes is therefore checked at a larger one, up to ``full``: it is refused only when
checking there would not fit in memory (the judge draws inputs and runs the reference at that size in its
own process) or in the evaluator's time, and the refusal names what differs at each smaller size. Tracing
imports the candidate, so this runs only inside the sandboxed TPU stage."""

from __future__ import annotations

from functools import partial
from types import ModuleType
from typing import Any

import jax
from jax._src import core
from pydantic import BaseModel, Field

from jaxbench.task import Task
from jaxbench.task_check import full_shapes
from maxkernel.targets.device import tpu_device
from maxkernel.targets.jaxpr_walk import find_pallas_calls
from maxkernel.targets.specs import TpuSpec
from maxkernel.targets.twins import Configuration, configuration_difference, static_steps, twin_difference

# Inputs, outputs and temporaries of the reference at the check size: the judge holds them in its process.
CHECK_MEMORY_BYTES = 3 << 30
# The correctness run must fit the evaluator's timeout: the reference runs five times on this CPU, and TPU
# interpret mode costs about 12 ms a grid step on 2 cores even for tiny blocks (measured on a 256-step
# gather kernel).
CHECK_FLOPS = 1e11
CHECK_GRID_STEPS = 1024


class CheckSize(BaseModel):
    """Where a TPU candidate's correctness is checked, or why it cannot be."""

    name: str = Field(description="size name used in reports, e.g. 'check(batch=2, seq=2048)'")
    values: dict[str, Any]
    grid_steps: int = Field(description="grid steps of all pallas_calls at the check size")
    reference_bytes: int | None = Field(default=None, description="reference memory at the check size (XLA:CPU)")
    reference_flops: float | None = Field(default=None, description="reference FLOPs at the check size (XLA:CPU)")
    refusal: str | None = Field(default=None, description="why the priced code cannot be checked")
    smaller: list[str] = Field(default_factory=list, description="what differs at the next smaller size, per parameter")


def size_name(values: dict[str, Any]) -> str:
    return "check(" + ", ".join(f"{k}={v}" for k, v in values.items()) + ")"


def trace_at(module: ModuleType, task: Task, values: dict[str, Any], spec: TpuSpec) -> core.Jaxpr:
    """The candidate's program at the size ``values``, traced from abstract inputs (nothing is allocated)."""
    name = size_name(values)
    arg_shapes, static, _ = full_shapes(task.with_size(name, values), name)
    with tpu_device(spec):
        return jax.jit(partial(module.kernel, **static)).trace(*arg_shapes).jaxpr.jaxpr


def _ladder(value: Any, floor: Any) -> list[int]:
    """Smaller values to try for one size parameter: halvings of ``value`` down to its ``cpu`` value."""
    if not isinstance(value, int) or isinstance(value, bool):
        return []
    lowest = floor if isinstance(floor, int) and not isinstance(floor, bool) and 1 <= floor <= value else 1
    rungs, current = [], value
    while current % 2 == 0 and current // 2 >= lowest:
        current //= 2
        rungs.append(current)
    return rungs


def derive_check_size(module: ModuleType, task: Task, spec: TpuSpec) -> CheckSize:
    """The check size of this candidate (see the module docstring); ``refusal`` says why there is none."""
    full = task.size("full")
    priced = trace_at(module, task, full, spec)
    configuration = Configuration.of(priced)
    traces: dict[str, core.Jaxpr | str] = {size_name(full): priced}

    def traced(values: dict[str, Any]) -> core.Jaxpr | str:
        """The trace at ``values``, or why there is none."""
        key = size_name(values)
        if key not in traces:
            try:
                traces[key] = trace_at(module, task, values, spec)
            except Exception as exc:  # the candidate or the task does not work at this size: not a check size
                first = (str(exc).strip().splitlines() or [""])[0][:200]
                traces[key] = f"it does not trace there ({type(exc).__name__}: {first})"
        return traces[key]

    filename = getattr(module, "__file__", "") or ""

    def kept(values: dict[str, Any]) -> str | None:
        """None when the trace at ``values`` is a twin of the priced one, else the first difference."""
        jaxpr = traced(values)
        if isinstance(jaxpr, str):
            return jaxpr
        return configuration_difference(configuration, Configuration.of(jaxpr)) or twin_difference(priced, jaxpr, filename)

    cpu = task.size("cpu")
    chosen = dict(full)
    stopped: list[str] = []  # why each parameter could not shrink further
    if cpu != full and kept(cpu) is None:
        chosen = cpu
    else:
        for name, value in full.items():
            for smaller in _ladder(value, cpu.get(name)):
                trial = {**chosen, name: smaller}
                why = kept(trial)
                if why is not None:
                    stopped.append(f"{name}={smaller}: {why}")
                    break
                chosen = trial
    checked = traced(chosen)
    assert not isinstance(checked, str)  # every chosen size traced (full itself was traced first)
    steps = sum(_steps(c.eqn.params["grid_mapping"].grid) for c in find_pallas_calls(checked))
    result = CheckSize(name=size_name(chosen), values=chosen, grid_steps=steps, smaller=stopped)
    result.reference_bytes, result.reference_flops = reference_cost(task, chosen)
    over = []
    if result.reference_bytes > CHECK_MEMORY_BYTES:
        over.append(f"{result.reference_bytes / 2**30:.1f} GiB of memory (limit {CHECK_MEMORY_BYTES / 2**30:.0f} GiB)")
    if (result.reference_flops or 0) > CHECK_FLOPS:
        over.append(f"{result.reference_flops:.2g} reference FLOPs (limit {CHECK_FLOPS:.0e})")
    if steps > CHECK_GRID_STEPS:
        over.append(f"{steps} grid steps in TPU interpret mode (limit {CHECK_GRID_STEPS})")
    if over:
        result.refusal = (f"priced code has no checked twin small enough to run: the smallest size that runs it, "
                          f"{result.name}, needs {' and '.join(over)} to check; smaller sizes differ: "
                          + ("; ".join(stopped[:2]) or "no size parameter can be halved"))
    return result


def reference_cost(task: Task, values: dict[str, Any]) -> tuple[int, float | None]:
    """(arguments + outputs + temporaries in bytes, FLOPs) of the reference compiled for this CPU at the size
    ``values``: what checking there costs the judge."""
    name = size_name(values)
    arg_shapes, static, _ = full_shapes(task.with_size(name, values), name)
    compiled = jax.jit(partial(task.reference, **static)).lower(*arg_shapes).compile()
    memory = compiled.memory_analysis()
    if memory is None:  # no analysis on this backend: count what goes in and out
        leaves = jax.tree_util.tree_leaves((arg_shapes, jax.eval_shape(partial(task.reference, **static), *arg_shapes)))
        used = int(sum(leaf.size * leaf.dtype.itemsize for leaf in leaves))
    else:
        used = int(memory.argument_size_in_bytes + memory.output_size_in_bytes + memory.temp_size_in_bytes)
    cost = compiled.cost_analysis()
    cost = (cost[0] if cost else {}) if isinstance(cost, list) else (cost or {})
    flops = cost.get("flops")
    return used, float(flops) if flops is not None else None


def _steps(grid: tuple[object, ...]) -> int:
    total = 1
    for extent in grid:
        total *= static_steps(extent) or 1
    return total
