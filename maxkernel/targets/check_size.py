"""The check size: the smallest task size at which a candidate still runs the code it is priced for at
``full``, so that correctness (TPU interpret mode on a CPU) is proven on the priced code.

Starting from ``full``, each integer size parameter is halved while the candidate traced there stays a twin
of its ``full`` trace (:mod:`maxkernel.targets.twins`: the same kernels, bodies, block shapes and XLA code,
at least two grid steps along each axis that has two or more at ``full``, at least two trips of each static
loop that makes two or more), then, where the halvings miss them (an extent with an odd factor its floor
lacks), its floor doubled while below what the halvings kept; a parameter is never taken below its ``cpu`` value (the smallest size the
task is known to work at) unless the task declares it ``free`` (served at any value: batch, tokens), which
goes down to its declared minimum; the ``cpu`` size itself is used when it is a twin. When the size so
found is still costly to check, pairs of parameters are halved together as well (parameters that are only
valid together: sequences and the decode sequences among them, query and kv heads in a fixed ratio). Free parameters matter
for kernels whose grid steps are expensive to interpret, such as paged attention's page-by-page DMAs: the
sequences a check runs are fewer, their pages and block configuration are those priced. A candidate that runs
other code at smaller sizes is therefore checked at a larger one, up to ``full``: it is refused only when
checking there would not fit in memory (the judge draws inputs and runs the reference at that size in its
own process) or in the evaluator's time, and the refusal names what differs at each smaller size. Tracing
imports the candidate, so this runs only inside the sandboxed TPU stage."""

from __future__ import annotations

from functools import partial
from types import ModuleType
from collections.abc import Callable
from typing import Any, TypeVar

import jax
import structlog
from jax._src import core
from pydantic import BaseModel, Field

from jaxbench.fingerprint import program_fingerprint
from jaxbench.task import Task
from jaxbench.task_check import full_shapes
from maxkernel.targets.coverage import coverage_difference
from maxkernel.targets.device import tpu_device
from maxkernel.targets.jaxpr_walk import find_pallas_calls, sub_jaxprs
from maxkernel.targets.specs import TpuSpec
from maxkernel.targets.twins import Configuration, configuration_difference, static_steps, twin_difference

log = structlog.get_logger("maxkernel.targets.check_size")
T = TypeVar("T")

# Inputs, outputs and temporaries of the reference at the check size: the judge holds them in its process.
CHECK_MEMORY_BYTES = 3 << 30
# The correctness run must fit the evaluator's timeout: the reference runs five times on this CPU, and TPU
# interpret mode costs about 12 ms a grid step on 2 cores even for tiny blocks (measured on a 256-step
# gather kernel).
CHECK_FLOPS = 1e11
CHECK_GRID_STEPS = 1024
# TPU interpret mode answers every ref access, DMA and semaphore operation of a kernel body with a host
# callback. Measured: JAX's paged_attention at its check size (16 grid steps of 64-page DMAs) makes about
# 8.5k such callbacks a run and takes 10-28 s a run on the 2 shared cores here (load 2-9): about 3 ms each
# at the worst. Kernels that copy pages one by one are dominated by this, not by their grid steps.
INTERPRET_OP_S = 3e-3
# The correctness run's fixed part: the worker compiles the candidate in TPU interpret mode (10-20 s
# measured for paged attention) while the judge draws inputs and runs the reference.
CHECK_BASE_S = 60.0
# Trips assumed for a kernel loop whose trip count is read from the data (not known from shapes).
DATA_LOOP_TRIPS = 2
# Beyond this the correctness run would not finish in a few minutes: the candidate is refused.
CHECK_TIMEOUT_CAP_S = 900.0
# Above this estimated interpreted time (or over a limit), pairs of parameters are also halved together.
JOINT_HALVING_S = 30.0
# Memory-touching primitives of a kernel body, each one host callback in TPU interpret mode.
INTERPRETED_PRIMITIVES = frozenset({"get", "swap", "addupdate", "dma_start", "dma_wait", "semaphore_signal",
                                    "semaphore_wait", "semaphore_read"})


class CheckSize(BaseModel):
    """Where a TPU candidate's correctness is checked, or why it cannot be."""

    name: str = Field(description="size name used in reports, e.g. 'check(batch=2, seq=2048)'")
    values: dict[str, Any]
    grid_steps: int = Field(description="grid steps of all pallas_calls at the check size")
    interpreted_ops: int = Field(default=0, description="estimated host callbacks of one run in TPU interpret "
                                                         "mode (ref accesses, DMAs, semaphores, block copies)")
    reference_bytes: int | None = Field(default=None, description="reference memory at the check size (XLA:CPU)")
    reference_flops: float | None = Field(default=None, description="reference FLOPs at the check size (XLA:CPU)")
    refusal: str | None = Field(default=None, description="why the priced code cannot be checked")
    smaller: list[str] = Field(default_factory=list, description="what differs at the next smaller size, per parameter")
    fingerprint: str | None = Field(default=None, description="the program traced at the check size "
                                    "(jaxbench.fingerprint): the checking worker must trace the same")


def size_name(values: dict[str, Any]) -> str:
    return "check(" + ", ".join(f"{k}={v}" for k, v in values.items()) + ")"


def trace_at(module: ModuleType, task: Task, values: dict[str, Any], spec: TpuSpec) -> core.Jaxpr:
    """The candidate's program at the size ``values``, traced from abstract inputs (nothing is allocated)."""
    return trace_closed_at(module, task, values, spec).jaxpr


def trace_closed_at(module: ModuleType, task: Task, values: dict[str, Any], spec: TpuSpec) -> core.ClosedJaxpr:
    """As :func:`trace_at`, with the program's constants (what the cost model prices and the fingerprint
    covers)."""
    name = size_name(values)
    arg_shapes, static, _ = full_shapes(task.with_size(name, values), name)
    with tpu_device(spec):
        return jax.jit(partial(module.kernel, **static)).trace(*arg_shapes).jaxpr


def _ladder(value: Any, floor: Any, multiple_of: int = 1) -> list[int]:
    """Smaller values to try for one size parameter: halvings of ``value`` down to ``floor`` (its ``cpu``
    value, or a free parameter's minimum), each a multiple of ``multiple_of``."""
    if not isinstance(value, int) or isinstance(value, bool):
        return []
    lowest = floor if isinstance(floor, int) and not isinstance(floor, bool) and 1 <= floor <= value else 1
    rungs, current = [], value
    while current % 2 == 0 and current // 2 >= lowest and (current // 2) % multiple_of == 0:
        current //= 2
        rungs.append(current)
    return rungs


def _doublings(value: Any, floor: Any, multiple_of: int, below: Any) -> list[int]:
    """Smaller values the halvings of ``value`` miss: ``floor`` doubled while under ``below`` (the value the
    halvings kept), largest first, each a multiple of ``multiple_of`` and none a halving of ``value``. An
    extent with an odd factor the floor lacks (14336 = 7 x 2048 against a ``cpu`` value of 512) halves to
    1792 or 896, where a block of 256 no longer divides it or the grid shrinks another way; 512 keeps the
    blocks and still runs two steps."""
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in (value, floor, below)):
        return []
    halvings = set(_ladder(value, floor, multiple_of))
    rungs, current = [], floor
    while current < below:
        if current % multiple_of == 0 and current not in halvings:
            rungs.append(current)
        current *= 2
    return rungs[::-1]


def _floor(task: Task, name: str, cpu: dict[str, Any]) -> tuple[Any, int]:
    """(lowest value, step) a size parameter may take at a check size: a free parameter's declared minimum,
    else the parameter's ``cpu`` value."""
    free = task.spec.free.get(name)
    if free is None:
        return cpu.get(name), 1
    return max(free.min, free.multiple_of), free.multiple_of


def check_ladder(task: Task, widths: bool = True) -> dict[str, dict[str, Any]]:
    """The sizes between ``full`` and ``cpu`` that a TPU check size is looked for at, along the walks of
    :func:`derive_check_size`, which takes the size parameters in order, each
    down its rungs while the candidate's trace stays a twin of the priced one: ``full`` with its first
    parameter that can shrink halved rung by rung to its floor, then each later parameter's rungs from
    there, both with the parameters between them at their floors (every one shrank) and at ``full`` (a
    kernel whose blocks follow them stopped them). A region whose reference is too heavy to check at every
    rung of ``seq`` alone, the dense experts of a MoE, is then checked with a width shrunk as well. Without
    ``widths`` only the first parameter's rungs. Region tasks carry programs for these too, so a region
    kernel, and the layer spliced from them, can be checked below ``full``."""
    full, cpu = task.size("full"), task.size("cpu")
    rungs = {name: _ladder(value, *_floor(task, name, cpu)) for name, value in full.items()}
    shrinking = [name for name in full if rungs[name]]
    ladder: dict[str, dict[str, Any]] = {}

    def add(base: dict[str, Any], name: str) -> None:
        prefix = "".join(f"{n}_{base[n]}_" for n in full if base[n] != full[n])
        for rung in rungs[name]:
            ladder[f"{prefix}{name}_{rung}"] = {**base, name: rung}

    if not shrinking:
        return {}
    first = shrinking[0]
    add(dict(full), first)
    if not widths:
        return ladder
    floored = {**full, first: rungs[first][-1]}
    for name in shrinking[1:]:
        add({**full, first: rungs[first][-1]}, name)  # the parameters between kept at full
        add(dict(floored), name)  # every earlier one at its floor
        floored[name] = rungs[name][-1]
    return ladder


def at_ladder(task: Task, at: Callable[[Task, str], T | None], widths: bool = False) -> dict[str, T]:
    """``at`` (the task at a size, the size's name) at each size of the check ladder (:func:`check_ladder`)
    where it gives something: what an emitter that writes code per size writes beside ``cpu`` and ``full``, so
    that the check size found below ``full`` runs code written for it. A rung the reference does not trace at
    adds nothing."""
    found: dict[str, T] = {}
    for name, values in check_ladder(task, widths).items():
        try:
            got = at(task.with_size(name, values), name)
        except Exception as exc:  # the reference's own code failing at a rung (any error of its own there)
            log.debug("ladder_rung_skipped", task=task.id, size=name, error=str(exc)[:200])
            continue
        if got is not None:
            found[name] = got
    return found


def _halve_pairs(chosen: dict[str, Any], full: dict[str, Any], task: Task, cpu: dict[str, Any],
                 kept: Any) -> dict[str, Any]:
    """``chosen`` with pairs of parameters halved together, each to its next rung, while the trace stays a
    twin (``kept`` is None); the pairs are tried in the task's order of parameters, again after each one
    taken."""
    names = [n for n in full if isinstance(full[n], int) and not isinstance(full[n], bool)]
    while True:
        rung = {}
        for name in names:
            floor, multiple_of = _floor(task, name, cpu)
            lower = _ladder(chosen[name], floor, multiple_of)
            if lower:
                rung[name] = lower[0]
        taken = None
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                if a in rung and b in rung:
                    trial = {**chosen, a: rung[a], b: rung[b]}
                    if kept(trial) is None:
                        taken = trial
                        break
            if taken is not None:
                break
        if taken is None:
            return chosen
        chosen = taken


def derive_check_size(module: ModuleType, task: Task, spec: TpuSpec, interpreted: bool = False,
                      priced_program: core.ClosedJaxpr | None = None) -> CheckSize:
    """The check size of this candidate (see the module docstring); ``refusal`` says why there is none.

    ``interpreted``: the check runs in TPU interpret mode, whose memory operations are host callbacks: they
    are estimated (``interpreted_ops``) and bound the check's time. ``priced_program``: the ``full`` trace
    the cost model prices (traced here when not given); each size is traced once."""
    full = task.size("full")
    closed_full = priced_program if priced_program is not None else trace_closed_at(module, task, full, spec)
    priced = closed_full.jaxpr
    configuration = Configuration.of(priced)
    programs: dict[str, core.ClosedJaxpr | str] = {size_name(full): closed_full}

    def traced_program(values: dict[str, Any]) -> core.ClosedJaxpr | str:
        key = size_name(values)
        if key not in programs:
            try:
                programs[key] = trace_closed_at(module, task, values, spec)
            except Exception as exc:  # the candidate or the task does not work at this size: not a check size
                first = (str(exc).strip().splitlines() or [""])[0][:200]
                programs[key] = f"it does not trace there ({type(exc).__name__}: {first})"
        return programs[key]

    def traced(values: dict[str, Any]) -> core.Jaxpr | str:
        """The trace at ``values``, or why there is none."""
        found = traced_program(values)
        return found if isinstance(found, str) else found.jaxpr

    filename = getattr(module, "__file__", "") or ""

    def kept(values: dict[str, Any]) -> str | None:
        """None when the trace at ``values`` is a twin of the priced one, else the first difference."""
        jaxpr = traced(values)
        if isinstance(jaxpr, str):
            return jaxpr
        return (configuration_difference(configuration, Configuration.of(jaxpr))
                or scratch_difference(priced, jaxpr) or twin_difference(priced, jaxpr, filename)
                or coverage_difference(priced, jaxpr))

    cpu = task.size("cpu")
    chosen = dict(full)
    failed: list[tuple[str, int, str]] = []  # (parameter, value, why it is not a twin there)

    def shrink(name: str, rungs: list[int]) -> None:
        """Take ``name`` down the ``rungs`` (largest first) while the trace stays a twin."""
        nonlocal chosen
        for smaller in rungs:
            trial = {**chosen, name: smaller}
            why = kept(trial)
            if why is not None:
                failed.append((name, smaller, why))
                return
            chosen = trial

    if cpu != full and kept(cpu) is None:
        chosen = cpu
    else:
        for name, value in full.items():
            floor, multiple_of = _floor(task, name, cpu)
            if name in task.spec.free and isinstance(value, int) and floor < value and floor % multiple_of == 0:
                shrink(name, [floor])  # one trace where the halvings down to a free minimum would take many
                if chosen[name] == floor:
                    continue
            shrink(name, _ladder(value, floor, multiple_of))
            shrink(name, _doublings(value, floor, multiple_of, chosen[name]))
    def cost(values: dict[str, Any]) -> tuple[int, int]:
        """(grid steps, interpreted memory operations) of one run at ``values``."""
        checked = traced(values)
        assert not isinstance(checked, str)  # every chosen size traced (full itself was traced first)
        calls = find_pallas_calls(checked)
        steps = sum(_steps(c.eqn.params["grid_mapping"].grid) for c in calls)
        ops = sum(int(c.count * _steps(c.eqn.params["grid_mapping"].grid) * _ops_per_step(c.eqn))
                  for c in calls) if interpreted else 0
        return steps, ops

    steps, ops = cost(chosen)
    if steps > CHECK_GRID_STEPS or ops * INTERPRET_OP_S > JOINT_HALVING_S or \
            (reference_cost(task, chosen)[1] or 0) > CHECK_FLOPS:
        # Parameters that only shrink together (sequences and the decode sequences among them; query and kv
        # heads, whose ratio a kernel's block folds): halve two at once while the trace stays a twin.
        chosen = _halve_pairs(chosen, full, task, cpu, kept)
        steps, ops = cost(chosen)
    # Why each parameter could not shrink further (a rung above the chosen value proves nothing).
    stopped = [f"{name}={value}: {why}" for name, value, why in failed if value < chosen[name]]
    result = CheckSize(name=size_name(chosen), values=chosen, grid_steps=steps, interpreted_ops=ops, smaller=stopped)
    checked = traced_program(chosen)
    assert not isinstance(checked, str)
    result.fingerprint = program_fingerprint(checked)
    result.reference_bytes, result.reference_flops = reference_cost(task, chosen)
    over = []
    if result.reference_bytes > CHECK_MEMORY_BYTES:
        over.append(f"{result.reference_bytes / 2**30:.1f} GiB of memory (limit {CHECK_MEMORY_BYTES / 2**30:.0f} GiB)")
    if (result.reference_flops or 0) > CHECK_FLOPS:
        over.append(f"{result.reference_flops:.2g} reference FLOPs (limit {CHECK_FLOPS:.0e})")
    if steps > CHECK_GRID_STEPS:
        over.append(f"{steps} grid steps in TPU interpret mode (limit {CHECK_GRID_STEPS})")
    if ops * INTERPRET_OP_S > CHECK_TIMEOUT_CAP_S:
        over.append(f"about {ops} interpreted memory operations a run, {ops * INTERPRET_OP_S:.0f} s "
                    f"(limit {CHECK_TIMEOUT_CAP_S:.0f} s)")
    if over:
        result.refusal = (f"priced code has no checked twin small enough to run: the smallest size that runs it, "
                          f"{result.name}, needs {' and '.join(over)} to check; smaller sizes differ: "
                          + ("; ".join(stopped[:2]) or "no size parameter can be halved"))
    return result


def scratch_difference(priced: core.Jaxpr, checked: core.Jaxpr) -> str | None:
    """Why ``checked``'s kernels do not use ``priced``'s scratch buffers (VMEM blocks that manual DMAs fill,
    accumulators), or None: a kernel that sizes them from a shape (pages a block shrunk to fit a shorter page
    table) runs another block configuration there."""
    for n, (full, check) in enumerate(zip(find_pallas_calls(priced), find_pallas_calls(checked)), start=1):
        wanted, found = _scratch_shapes(full.eqn), _scratch_shapes(check.eqn)
        for k, (a, b) in enumerate(zip(wanted, found)):
            if a != b:
                return (f"kernel {full.name} (pallas_call {n}): scratch buffer {k} is {a} at full size but {b} at "
                        "the check size")
    return None


def _scratch_shapes(eqn: core.JaxprEqn) -> list[tuple[int, ...]]:
    count = eqn.params["grid_mapping"].num_scratch_operands
    refs = eqn.params["jaxpr"].invars[len(eqn.params["jaxpr"].invars) - count:] if count else []
    return [tuple(getattr(v.aval, "shape", ())) for v in refs]


def check_timeout_s(check: CheckSize, runs: int, default_s: float) -> float:
    """Wall-clock seconds the correctness run at ``check`` may take: ``default_s``, or more when ``runs``
    interpreted runs of its memory operations need it (capped: larger checks are refused beforehand)."""
    needed = CHECK_BASE_S + runs * check.interpreted_ops * INTERPRET_OP_S
    return max(default_s, min(needed, CHECK_TIMEOUT_CAP_S + CHECK_BASE_S))


def _ops_per_step(eqn: core.JaxprEqn) -> float:
    """Host callbacks of one grid step of a pallas_call in TPU interpret mode: its body's memory operations
    plus the copy of each blocked operand in and out."""
    grid_mapping = eqn.params["grid_mapping"]
    return _interpreted(eqn.params["jaxpr"]) + 2 * len(grid_mapping.block_mappings)


def _interpreted(jaxpr: core.Jaxpr) -> float:
    """Memory operations one run of ``jaxpr`` makes: loops multiplied by their trips, the heavier branch
    of a cond."""
    total = 0.0
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name in INTERPRETED_PRIMITIVES:
            total += 1
        elif name == "cond":
            total += max((_interpreted(branch.jaxpr) for branch in eqn.params["branches"]), default=0.0)
        elif name == "scan":
            total += eqn.params["length"] * _interpreted(eqn.params["jaxpr"].jaxpr)
        elif name == "while":
            body = eqn.params["body_jaxpr"].jaxpr
            total += _fori_trips(eqn) * (_interpreted(body) + _interpreted(eqn.params["cond_jaxpr"].jaxpr))
        else:
            total += sum(_interpreted(sub) for _, sub in sub_jaxprs(eqn))
    return total


def _fori_trips(eqn: core.JaxprEqn) -> float:
    """A while loop's trips when it is a fori_loop over literal bounds, else DATA_LOOP_TRIPS."""
    bounds = eqn.invars[eqn.params["cond_nconsts"] + eqn.params["body_nconsts"]:][:3]
    if len(bounds) == 3 and all(isinstance(v, core.Literal) for v in bounds[:2]):
        low, high = (int(v.val) for v in bounds[:2])
        return float(max(high - low, 0))
    return float(DATA_LOOP_TRIPS)


def _draw_temporaries(task: Task, name: str) -> int:
    """Bytes drawing the inputs at size ``name`` holds besides the inputs themselves: a model region's draw
    runs its layer up to the region, with every weight of the layer (compiled for this CPU, allocating
    nothing; 0 when the draw does not compile as one program)."""
    key = (str(task.path), task.source_digest, name)
    if key not in _DRAWS:
        try:
            compiled = jax.jit(lambda k: task.get_inputs(k, name)[0]).lower(jax.random.key(0)).compile()
            memory = compiled.memory_analysis()
            _DRAWS[key] = int(memory.temp_size_in_bytes) if memory is not None else 0
        except Exception:  # a draw with host-side steps: its peak is not known here
            _DRAWS[key] = 0
    return _DRAWS[key]


_DRAWS: dict[tuple[str, str, str], int] = {}


def reference_cost(task: Task, values: dict[str, Any]) -> tuple[int, float | None]:
    """(arguments + outputs + temporaries in bytes, with what drawing the arguments holds besides them, and
    FLOPs) of the reference compiled for this CPU at the size ``values``: what checking there costs the judge."""
    name = size_name(values)
    task = task.with_size(name, values)
    arg_shapes, static, _ = full_shapes(task, name)
    compiled = jax.jit(partial(task.reference, **static)).lower(*arg_shapes).compile()
    memory = compiled.memory_analysis()
    if memory is None:  # no analysis on this backend: count what goes in and out
        leaves = jax.tree_util.tree_leaves((arg_shapes, jax.eval_shape(partial(task.reference, **static), *arg_shapes)))
        used = int(sum(leaf.size * leaf.dtype.itemsize for leaf in leaves))
    else:
        used = int(memory.argument_size_in_bytes + memory.output_size_in_bytes + memory.temp_size_in_bytes)
    used += _draw_temporaries(task, name)
    cost = compiled.cost_analysis()
    cost = (cost[0] if cost else {}) if isinstance(cost, list) else (cost or {})
    flops = cost.get("flops")
    return used, float(flops) if flops is not None else None


def _steps(grid: tuple[object, ...]) -> int:
    total = 1
    for extent in grid:
        total *= static_steps(extent) or 1
    return total
