"""The TPU roofline cost model: a modelled time for a candidate or a reference on one TPU generation.

A Pallas kernel is modelled as its grid pipeline: per grid step ``max(compute, memory) + overhead``, where
compute is the work the kernel body does at that step (MXU/VPU/EUP at peak; branches and loop trips as
``work`` follows them) and memory is the HBM traffic of the blocks whose index changes at that step (plus
manual DMAs), then the first step's input fetch before and the last step's output write after. Work outside
the kernels (and plain-JAX candidates and references) is ``max(compute, bytes accessed / bandwidth)`` with
matmuls at the efficiency XLA reaches. HBM streams at ``model.hbm_efficiency`` of its peak, and every program
pays one ``model.dispatch_overhead_s`` (constants in ``config/targets.yaml``; fitted by
``maxkernel.targets.calibration``). All figures are ``basis="modelled"``.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any, Literal

import jax
import numpy as np
from jax._src import core
from pydantic import BaseModel, Field

from jaxbench.task import Task
from jaxbench.task_check import full_shapes
from maxkernel.targets.blocks import StepTraffic, check_vmem, compiler_param, step_traffic
from maxkernel.targets.device import tpu_device
from maxkernel.targets.grid import GridSample
from maxkernel.targets.jaxpr_walk import PallasCall, find_pallas_calls
from maxkernel.targets.loader import load_candidate
from maxkernel.targets.names import TargetError
from maxkernel.targets.ops import OpCounts, UnboundedLoopError
from maxkernel.targets.control import UNKNOWN
from maxkernel.targets.prefetch import PRICING_SEEDS, call_operands, drawn_with
from maxkernel.targets.specs import ModelConstants, TpuSpec, load_model_constants, load_tpu_spec
from maxkernel.targets.work import StepWork, kernel_axes, step_work
from maxkernel.targets.xla_cost import XlaCost, glue_cost, small_inputs, xla_cost
from maxkernel.targets.xla_tpu import INSTALL_HINT, STARTUP_ERRORS

# How far the fallback (XLA:CPU bytes) was off on the measured plain-JAX programs (benchmarks/tpu_calibration.py).
FALLBACK_ERROR = "6x"

Bound = Literal["compute", "memory", "overhead"]


class ModelError(TargetError):
    """The candidate cannot be modelled (it does not trace at full size, or a grid extent cannot be computed)."""


class KernelEstimate(BaseModel):
    """One pallas_call site; totals cover all its runs (``count``) per program run."""

    name: str
    grid: list[int]
    grid_steps: int
    count: float = Field(description="runs per program run (scan lengths multiplied)")
    cores: int = Field(description="TensorCores the grid is split over")
    time_ms: float
    compute_ms: float
    memory_ms: float
    overhead_ms: float
    bound: Bound
    bytes: float = Field(description="HBM<->VMEM bytes moved")
    flops: float
    mxu_flops: float
    vpu_ops: float
    transcendentals: float
    vmem_bytes: int
    vmem_budget_bytes: int
    sampled: bool = Field(description="index maps evaluated on a random sample of grid steps")


class ModelEstimate(BaseModel):
    """Modelled cost of one program (candidate or reference) on one TPU generation."""

    target: str
    generation: str
    basis: Literal["modelled"] = "modelled"
    kind: Literal["pallas", "xla"] = Field(description="pallas: grid pipeline model; xla: XLA roofline")
    time_ms: float
    bound: Bound
    compute_ms: float
    memory_ms: float
    overhead_ms: float
    vmem_bytes: int | None = Field(description="largest kernel VMEM footprint (None for XLA programs)")
    vmem_budget_bytes: int
    roofline_fraction: float = Field(description="max(work at peak, task I/O bytes / bandwidth) / time, <= 1")
    grid_steps: int
    bytes: float
    flops: float
    mxu_flops: float
    vpu_ops: float
    transcendentals: float
    kernels: list[KernelEstimate] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)

    def as_report_fields(self) -> dict[str, Any]:
        """A JSON-ready dict for ``EvalReport.model``."""
        return self.model_dump(mode="json")


def model_candidate(candidate_source: str, task: Task, generation: str,
                    program: core.ClosedJaxpr | None = None) -> ModelEstimate:
    """Modelled cost of a candidate at the task's ``full`` size on ``generation``. ``program``: the candidate
    already traced at ``full`` (the very program whose twin is checked); traced here when not given.

    Raises (all TargetError, one-line messages): CandidateLoadError if the source does not load, ModelError
    if it does not trace at full size or cannot be priced, VmemBudgetError if a kernel does not fit in VMEM.
    """
    spec = load_tpu_spec(generation)
    arg_shapes, static, out_shapes = full_shapes(task, "full")
    if program is None:
        fn = partial(load_candidate(candidate_source).kernel, **static)
        with tpu_device(spec):
            try:
                closed = jax.jit(fn).trace(*arg_shapes).jaxpr
            except Exception as exc:
                raise ModelError(f"candidate does not trace at full size: {type(exc).__name__}: "
                                 f"{_first_line(exc)}") from exc
    else:
        closed = program
        fn = _program_function(program)
    depends = _depends_on_draws(closed, task, arg_shapes)
    return _dearest(lambda: _price_program(closed, fn, task, spec, arg_shapes, out_shapes), depends)


def _depends_on_draws(closed: core.ClosedJaxpr, task: Task, arg_shapes: Any) -> bool:
    """Whether the price can change with the inputs' values: a kernel with scalar-prefetch operands or a
    dynamic grid, or small integer inputs (group sizes, lengths) that loops and branches may follow."""
    for call in find_pallas_calls(closed.jaxpr):
        grid_mapping = call.eqn.params["grid_mapping"]
        if grid_mapping.num_dynamic_grid_bounds + grid_mapping.num_index_operands:
            return True
    return any(v is not UNKNOWN for v in small_inputs(task, arg_shapes))


def _dearest(price: Any, depends: bool) -> ModelEstimate:
    """``price()`` on one draw of the inputs, or where it depends on them, on each of ``PRICING_SEEDS``
    and the dearest."""
    if not depends:
        return price()
    estimates = []
    for seed in PRICING_SEEDS:
        with drawn_with(seed):
            estimates.append(price())
    worst = max(estimates, key=lambda e: e.time_ms)
    times = ", ".join(f"{e.time_ms:.4g}" for e in estimates)
    worst.notes.append(f"data-dependent: priced at the dearest of {len(estimates)} draws at full ({times} ms)")
    return worst


def _price_program(closed: core.ClosedJaxpr, fn: Any, task: Task, spec: TpuSpec, arg_shapes: Any,
                   out_shapes: Any) -> ModelEstimate:
    calls = find_pallas_calls(closed.jaxpr)
    io_bytes = _io_bytes(arg_shapes, out_shapes)
    if not calls:
        try:
            cost = xla_cost(fn, arg_shapes, partial(small_inputs, task, arg_shapes), tpu_generation=spec.name)
        except UnboundedLoopError:
            raise
        except Exception as exc:
            raise ModelError(f"XLA cannot price the candidate: {type(exc).__name__}: {_first_line(exc)}") from exc
        return _xla_estimate(cost, spec, io_bytes, ["plain JAX: XLA roofline"])
    notes: list[str] = []
    kernels = []
    for call in calls:
        extents, prefetch = _operands(closed, call, task, notes)
        kernels.append(_kernel_estimate(call, spec, extents, prefetch, notes))
    try:
        glue = glue_cost(closed, calls, partial(small_inputs, task, arg_shapes), tpu_generation=spec.name)
    except UnboundedLoopError:
        raise
    except Exception as exc:  # code the model cannot price is refused, never counted as free
        raise ModelError(f"the XLA code around the kernels cannot be priced: {type(exc).__name__}: "
                         f"{_first_line(exc)}") from exc
    copied = _alias_copy_bytes(closed, calls)
    if copied:
        glue.bytes += copied
        notes.append(f"aliased program inputs are copied before the kernels write them: {copied:.4g} bytes")
    return _combine(kernels, glue, spec, io_bytes, notes)


def _alias_copy_bytes(closed: core.ClosedJaxpr, calls: list[PallasCall]) -> float:
    """HBM bytes of the copies XLA makes of program inputs a kernel aliases to an output: the evaluator never
    donates its arguments, so each such input is read and written once more before the kernel runs (the copy
    is not in the traced program)."""
    inputs = set(closed.jaxpr.invars)
    copied = 0.0
    for call in calls:
        for operand, _ in call.eqn.params.get("input_output_aliases", ()):
            var = call.eqn.invars[operand]
            if isinstance(var, core.Var) and var in inputs:
                copied += 2.0 * math.prod(var.aval.shape) * np.dtype(var.aval.dtype).itemsize * call.count
    return copied


def _program_function(program: core.ClosedJaxpr) -> Any:
    """A traced program as a function of the task's arguments (pytrees flattened as the trace did)."""
    run = core.jaxpr_as_fun(program)
    return lambda *args: run(*jax.tree_util.tree_leaves(args))


def model_reference(task: Task, generation: str) -> ModelEstimate:
    """Modelled cost of the task's reference (plain JAX) at ``full`` size on ``generation``."""
    spec = load_tpu_spec(generation)
    arg_shapes, static, out_shapes = full_shapes(task, "full")
    fn = partial(task.reference, **static)

    def price() -> ModelEstimate:
        cost = xla_cost(fn, arg_shapes, partial(small_inputs, task, arg_shapes), tpu_generation=spec.name)
        return _xla_estimate(cost, spec, _io_bytes(arg_shapes, out_shapes), ["reference: XLA roofline"])

    return _dearest(price, any(v is not UNKNOWN for v in small_inputs(task, arg_shapes)))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else ""


def _io_bytes(arg_shapes: Any, out_shapes: Any) -> float:
    leaves = jax.tree_util.tree_leaves((arg_shapes, out_shapes))
    return float(sum(math.prod(x.shape) * np.dtype(x.dtype).itemsize for x in leaves))


def _operands(closed: core.ClosedJaxpr, call: PallasCall, task: Task,
              notes: list[str]) -> tuple[list[int] | None, list[np.ndarray] | None]:
    """(dynamic grid extents, scalar-prefetch values) of one call from the task's inputs; None where unknown."""
    try:
        found = call_operands(closed, call, task)
    except Exception as exc:  # the stubbed re-run can fail on exotic programs: fall back, and say so
        notes.append(f"{call.name}: scalar-prefetch values not computed ({type(exc).__name__})")
        return None, None
    if found is None:
        notes.append(f"{call.name}: scalar-prefetch values depend on a loop or another kernel")
        return None, None
    return found


def _static_grid(call: PallasCall, extents: list[int] | None) -> tuple[int, ...]:
    """The grid with each dynamic extent (a traced value, e.g. megablox's active tiles) replaced by its value."""
    grid = call.eqn.params["grid_mapping"].grid
    if all(isinstance(g, (int, np.integer)) for g in grid):
        return tuple(int(g) for g in grid)
    if extents is None:
        raise ModelError(f"kernel {call.name}: grid {tuple(grid)} has an extent computed from values the model "
                         "cannot evaluate (inside a loop, or from another kernel's output)")
    values = iter(extents)
    return tuple(int(g) if isinstance(g, (int, np.integer)) else next(values) for g in grid)


def _cores_used(spec: TpuSpec, call: PallasCall, grid: tuple[int, ...]) -> int:
    """Megacore chips split a kernel's grid over both TensorCores only along a "parallel" dimension."""
    if spec.cores_per_device == 1:
        return 1
    grid_mapping = call.eqn.params["grid_mapping"]
    given = iter(compiler_param(call.eqn, "dimension_semantics") or ())
    # The semantics name the axes the kernel sees; Mosaic marks the axes vmap added "parallel".
    visible = set(kernel_axes(grid_mapping))
    semantics = [next(given, "arbitrary") if axis in visible else "parallel" for axis in range(len(grid))]
    for sem, extent in zip(semantics, grid):
        if str(getattr(sem, "value", sem)).lower() in ("parallel", "core_parallel") and extent >= 2:
            return spec.cores_per_device
    return 1


def _bound(compute: float, memory: float, overhead: float) -> Bound:
    parts = {"compute": compute, "memory": memory, "overhead": overhead}
    return max(parts, key=parts.__getitem__)  # type: ignore[return-value]


def _kernel_estimate(call: PallasCall, spec: TpuSpec, extents: list[int] | None,
                     prefetch: list[np.ndarray] | None, notes: list[str]) -> KernelEstimate:
    grid_mapping = call.eqn.params["grid_mapping"]
    sample = GridSample.of(_static_grid(call, extents))
    used, budget = check_vmem(call.eqn, call.name, spec)
    try:
        work = step_work(call.eqn.params["jaxpr"], grid_mapping, sample, prefetch)
    except UnboundedLoopError as exc:
        raise UnboundedLoopError(f"kernel {call.name}: {exc}") from exc
    traffic = step_traffic(grid_mapping, sample, prefetch)
    totals = work.totals()
    notes.extend(f"{call.name}: {note}" for note in [*dict.fromkeys(work.notes), *traffic.notes])
    cores = _cores_used(spec, call, sample.grid)
    bandwidth = spec.per_core(spec.hbm_bandwidth) * _constants().hbm_efficiency.value
    compute_first, compute_t = work.seconds(spec)
    dma_first, dma_t = work.dma_bytes()
    steps = sample.steps
    time_s = pipeline_seconds(work, traffic, sample, spec, cores) * call.count
    moved = traffic.total_bytes + dma_first + sample.weight * float(dma_t.sum())
    compute_s = compute_first + sample.weight * float(compute_t.sum())
    per_run = call.count / cores
    return KernelEstimate(
        name=call.name, grid=list(sample.grid), grid_steps=steps, count=call.count, cores=cores,
        time_ms=time_s * 1e3,
        compute_ms=compute_s * per_run * 1e3,
        memory_ms=moved / bandwidth * per_run * 1e3,
        overhead_ms=steps * spec.step_overhead_s * per_run * 1e3,
        bound=_bound(compute_s, moved / bandwidth, steps * spec.step_overhead_s),
        bytes=moved * call.count, flops=totals.flops * call.count, mxu_flops=totals.mxu_flops * call.count,
        vpu_ops=totals.vpu * call.count, transcendentals=totals.transcendental * call.count,
        vmem_bytes=used, vmem_budget_bytes=budget, sampled=sample.sampled,
    )


def pipeline_seconds(work: StepWork, traffic: StepTraffic, sample: GridSample, spec: TpuSpec, cores: int) -> float:
    """One run of a kernel's grid pipeline: steps t >= 1 overlap their block transfers (and manual DMAs) with
    compute, step 0's inputs come first and the last step's outputs after; every grid step pays
    ``step_overhead_s`` and every manual DMA ``model.dma_overhead_s`` (issued by the scalar unit, in series)."""
    constants = _constants()
    bandwidth = spec.per_core(spec.hbm_bandwidth) * constants.hbm_efficiency.value
    compute_first, compute_t = work.seconds(spec)
    dma_first, dma_t = work.dma_bytes()
    issued_first, issued_t = work.dma_count()
    steady = max(compute_first, dma_first / bandwidth) + sample.weight * float(
        np.maximum(compute_t, (traffic.step_bytes + dma_t) / bandwidth).sum())
    issued = issued_first + sample.weight * float(issued_t.sum())
    edges = (traffic.first_bytes + traffic.last_bytes) / bandwidth
    overheads = sample.steps * spec.step_overhead_s + issued * constants.dma_overhead_s.value
    return edges + (steady + overheads) / cores


def _constants() -> ModelConstants:
    return load_model_constants()


def _device_bandwidth(spec: TpuSpec) -> float:
    """HBM bandwidth one device streams at: the published peak times the fraction code really reaches."""
    return spec.per_core(spec.hbm_bandwidth) * spec.cores_per_device * _constants().hbm_efficiency.value


def _xla_parts(cost: XlaCost, spec: TpuSpec) -> tuple[float, float]:
    """(compute, memory) seconds of XLA code. From XLA:TPU's compiled program where it was compiled: its time is
    the larger part, the other its share of it (memory: its bytes at the sustained bandwidth); otherwise the
    fallback roofline on XLA:CPU's bytes."""
    compute = cost.counts.compute_seconds(spec, spec.cores_per_device, xla=True)
    memory = cost.bytes / _device_bandwidth(spec)
    if cost.tpu is None:
        return compute, memory
    # Never faster than its matmuls at the MXU's peak (the scale could otherwise take a matmul past it).
    total = max(cost.tpu.seconds * _constants().xla_tpu_scale.value,
                OpCounts(mxu=dict(cost.counts.mxu)).compute_seconds(spec, spec.cores_per_device))
    return (total, min(memory, total)) if memory < total else (min(compute, total), total)


def xla_basis_note(cost: XlaCost, what: str) -> str:
    """Which path priced the XLA code, and how far the figure is to be trusted."""
    if cost.tpu is not None:
        return (f"{what}: priced by XLA:TPU's compiled program ({cost.tpu.seconds * 1e3:.4g} ms optimal_seconds, "
                f"{cost.tpu.bytes:.4g} bytes accessed, {cost.tpu.temp_bytes:.4g} temp bytes)")
    why = next(iter(STARTUP_ERRORS.values()), None)
    missing = (f"XLA:TPU did not compile it: {cost.refused}" if cost.refused
               else f"the TPU compiler could not start: {why}" if why
               else f"the TPU compiler is not installed: {INSTALL_HINT}")
    return (f"{what}: FALLBACK roofline on XLA:CPU's bytes ({cost.bytes:.4g} accessed; {missing}); XLA:TPU's "
            f"fusion is not modelled, measured off by up to "
            f"{FALLBACK_ERROR} on real v6e programs (docs/cost-model.md)")


def _ideal_seconds(counts: OpCounts, spec: TpuSpec, io_bytes: float) -> float:
    return max(counts.compute_seconds(spec, spec.cores_per_device), io_bytes / _device_bandwidth(spec))


def _xla_estimate(cost: XlaCost, spec: TpuSpec, io_bytes: float, notes: list[str]) -> ModelEstimate:
    compute, memory = _xla_parts(cost, spec)
    dispatch = _constants().dispatch_overhead_s.value
    time_s = max(compute, memory) + dispatch
    counts = cost.counts
    notes = [*notes, xla_basis_note(cost, "XLA program")]
    return ModelEstimate(
        target=spec.target, generation=spec.name, kind="xla", time_ms=time_s * 1e3,
        bound=_bound(compute, memory, 0.0), compute_ms=compute * 1e3, memory_ms=memory * 1e3,
        overhead_ms=dispatch * 1e3,
        vmem_bytes=None, vmem_budget_bytes=spec.scoped_vmem_bytes,
        roofline_fraction=min(1.0, _ideal_seconds(counts, spec, io_bytes) / time_s),
        grid_steps=0, bytes=cost.bytes, flops=counts.flops, mxu_flops=counts.mxu_flops, vpu_ops=counts.vpu,
        transcendentals=counts.transcendental, notes=notes,
    )


def _combine(kernels: list[KernelEstimate], glue: XlaCost, spec: TpuSpec, io_bytes: float,
             notes: list[str]) -> ModelEstimate:
    glue_compute, glue_memory = _xla_parts(glue, spec)
    compute = sum(k.compute_ms for k in kernels) / 1e3 + glue_compute
    memory = sum(k.memory_ms for k in kernels) / 1e3 + glue_memory
    dispatch = _constants().dispatch_overhead_s.value
    overhead = sum(k.overhead_ms for k in kernels) / 1e3 + dispatch
    time_s = sum(k.time_ms for k in kernels) / 1e3 + max(glue_compute, glue_memory) + dispatch
    mxu = sum(k.mxu_flops for k in kernels) + glue.counts.mxu_flops
    vpu = sum(k.vpu_ops for k in kernels) + glue.counts.vpu
    trans = sum(k.transcendentals for k in kernels) + glue.counts.transcendental
    # The ideal runs the same work on every core of the device, and moves only the task's inputs and outputs.
    ideal_compute = sum(k.compute_ms * k.cores for k in kernels) / spec.cores_per_device / 1e3 + glue_compute
    ideal = max(ideal_compute, io_bytes / _device_bandwidth(spec))
    if glue.bytes:
        notes.append(xla_basis_note(glue, "XLA code around the kernels"))
    largest = max(kernels, key=lambda k: k.vmem_bytes)
    return ModelEstimate(
        target=spec.target, generation=spec.name, kind="pallas", time_ms=time_s * 1e3,
        bound=_bound(compute, memory, overhead - dispatch), compute_ms=compute * 1e3, memory_ms=memory * 1e3,
        overhead_ms=overhead * 1e3, vmem_bytes=largest.vmem_bytes, vmem_budget_bytes=largest.vmem_budget_bytes,
        roofline_fraction=min(1.0, ideal / time_s), grid_steps=sum(int(k.grid_steps * k.count) for k in kernels),
        bytes=sum(k.bytes for k in kernels) + glue.bytes, flops=mxu + vpu + trans, mxu_flops=mxu, vpu_ops=vpu,
        transcendentals=trans, kernels=kernels, notes=notes,
    )
