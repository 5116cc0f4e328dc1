"""The GPU cost model: a modelled time for a candidate or a reference on one NVIDIA chip.

A pallas_call is modelled per program instance (grid cell, one thread block): the dot, elementwise and
transcendental work its body does (loop trips and branches followed per cell, as for TPU), and the
global-memory windows its BlockSpecs cover (for Triton, where a window is only a pointer, no more than
the bytes its body loads on the trips it makes, and the blocks it stores). Occupancy is the number of instances one SM holds at once
(warps and shared memory, :mod:`maxkernel.targets.gpu_blocks`); the grid runs in waves of ``sms x occupancy``
instances, and each wave costs the larger of its compute on the SMs (slowed where too few warps are resident
to hide latency, ``gpu.model.saturating_warps``) and its HBM traffic. HBM traffic counts each distinct block
window once: instances that share a window (the keys and values of one head) are served from L2. Tensor-core
work runs at ``gpu.model.dot_efficiency`` of peak (fitted to Triton's fused-attention tutorial by
:mod:`maxkernel.targets.gpu_calibration`). Plain JAX (references, glue) is an XLA roofline: dots at
``xla_dot_efficiency``, bytes as XLA's cost analysis counts them. All figures are ``basis="modelled"``.
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
from maxkernel.targets.control import UNKNOWN
from maxkernel.targets.gpu_blocks import ProgramShape, check_smem, resident_blocks
from maxkernel.targets.gpu_spec import GpuModelConstants, GpuSpec, load_gpu_constants, load_gpu_spec
from maxkernel.targets.gpu_work import gpu_step_work, small_operands
from maxkernel.targets.grid import GridSample
from maxkernel.targets.jaxpr_walk import PallasCall, find_pallas_calls
from maxkernel.targets.loader import load_candidate
from maxkernel.targets.names import TargetError
from maxkernel.targets.model import ModelError, _dearest, _depends_on_draws, _first_line, _io_bytes, _program_function
from maxkernel.targets.ops import OpCounts, UnboundedLoopError
from maxkernel.targets.xla_cost import XlaCost, glue_cost, small_inputs, xla_cost

Bound = Literal["compute", "memory", "overhead"]
EXACT_CELLS = 1 << 16  # grids up to this many cells have their distinct windows counted exactly


class GpuKernelEstimate(BaseModel):
    """One pallas_call site on a GPU; totals cover all its runs per program run."""

    name: str
    grid: list[int]
    cells: int
    count: float
    backend: str
    num_warps: int
    num_stages: int
    smem_bytes: int
    register_bytes: int = Field(0, description="Triton: bytes of loaded values no dot reads (held in registers)")
    occupancy: int = Field(description="program instances resident per SM")
    waves: int
    time_ms: float
    compute_ms: float
    memory_ms: float
    overhead_ms: float
    bound: Bound
    bytes: float = Field(description="HBM bytes (distinct block windows)")
    flops: float
    dot_flops: float


class GpuModelEstimate(BaseModel):
    """Modelled cost of one program (candidate or reference) on one GPU chip."""

    target: str
    chip: str
    basis: Literal["modelled"] = "modelled"
    kind: Literal["pallas", "xla"]
    time_ms: float
    bound: Bound
    compute_ms: float
    memory_ms: float
    overhead_ms: float
    roofline_fraction: float = Field(description="max(work at peak, task I/O / bandwidth) / time, <= 1")
    bytes: float
    flops: float
    dot_flops: float
    kernels: list[GpuKernelEstimate] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)

    def as_report_fields(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def _constants() -> GpuModelConstants:
    return load_gpu_constants()


def _bandwidth(spec: GpuSpec) -> float:
    return spec.hbm_bandwidth * _constants().hbm_efficiency.value


def compute_seconds(counts: OpCounts, spec: GpuSpec, dot_efficiency: float, share: float = 1.0) -> float:
    """Time of ``counts`` on ``share`` of the chip: dots on the tensor cores (f32 at TF32, HIGHEST on the CUDA
    cores) overlapping the elementwise work (CUDA cores) and transcendentals (SFUs) that other warps issue
    meanwhile, so the slower of the two pipes."""
    rates = {"bf16": spec.peak_bf16_flops * dot_efficiency, "f32": spec.peak_tf32_flops * dot_efficiency,
             "f32_high": spec.peak_f32_flops, "int8": spec.peak_int8_ops * dot_efficiency}
    dots = sum(flops / (rates[cls] * share) for cls, flops in counts.mxu.items())
    return max(dots, counts.vpu / (spec.cuda_core_ops * share) + counts.transcendental / (spec.sfu_ops * share))


def distinct_window_bytes(eqn: core.JaxprEqn, notes: list[str]) -> float:
    """HBM bytes of a call: every distinct block window of every operand once (shared ones hit in L2);
    see :func:`all_window_bytes` for what L2 serves."""
    grid_mapping = eqn.params["grid_mapping"]
    grid = tuple(int(g) for g in grid_mapping.grid)
    cells = math.prod(grid) if grid else 1
    from maxkernel.targets.gpu_blocks import _block_bytes

    if grid_mapping.num_index_operands or cells > EXACT_CELLS:
        notes.append(f"{eqn.params.get('name') or 'kernel'}: windows not deduplicated (every cell's counted)")
        return float(cells * sum(_block_bytes(bm) for bm in grid_mapping.block_mappings))
    ids = [np.asarray(c, dtype=np.int32).ravel() for c in np.indices(grid)] if grid else []
    total = 0.0
    for bm in grid_mapping.block_mappings:
        closed = bm.index_map_jaxpr

        def at(*point: Any, closed: Any = closed) -> list[Any]:
            return core.eval_jaxpr(closed.jaxpr, closed.consts, *point)

        index = jax.vmap(at)(*ids) if ids else at()
        rows = np.stack([np.broadcast_to(np.asarray(x), (max(cells, 1),)) for x in index], axis=1)
        total += len(np.unique(rows, axis=0)) * _block_bytes(bm)
    return total


def all_window_bytes(eqn: core.JaxprEqn) -> float:
    """Bytes every instance reads and writes through L2: its windows, each instance its own."""
    from maxkernel.targets.gpu_blocks import _block_bytes

    grid_mapping = eqn.params["grid_mapping"]
    cells = math.prod(int(g) for g in grid_mapping.grid) if grid_mapping.grid else 1
    return float(cells * sum(_block_bytes(bm) for bm in grid_mapping.block_mappings))


def _kernel_estimate(call: PallasCall, spec: GpuSpec, notes: list[str], dot_efficiency: float | None = None,
                     known: dict[int, np.ndarray] | None = None) -> GpuKernelEstimate:
    c = _constants()
    efficiency = c.dot_efficiency.value if dot_efficiency is None else dot_efficiency
    shape: ProgramShape = check_smem(call.eqn, call.name, spec)
    grid_mapping = call.eqn.params["grid_mapping"]
    sample = GridSample.of(grid_mapping.grid)
    try:
        work = gpu_step_work(call, sample, known or {})
    except UnboundedLoopError as exc:
        raise UnboundedLoopError(f"kernel {call.name}: {exc}") from exc
    notes.extend(f"{call.name}: {n}" for n in dict.fromkeys(work.notes))
    totals = work.totals()
    moved = distinct_window_bytes(call.eqn, notes)
    through_l2 = all_window_bytes(call.eqn)
    if shape.backend == "triton" and totals.ref_load_bytes:
        # A Triton window is only a pointer: global memory serves what the body loads (the trips it makes:
        # a decode kernel's pages up to its sequence's length) and the blocks it stores.
        loaded = totals.ref_load_bytes + shape.store_bytes * shape.cells
        moved, through_l2 = min(moved, loaded), min(through_l2, loaded)
    l2_bandwidth = spec.hbm_bandwidth * c.l2_bandwidth_ratio.value
    cells = shape.cells
    occupancy = resident_blocks(shape, spec)
    per_wave = spec.sms * occupancy
    waves = max(1, math.ceil(cells / per_wave))
    # One instance's work, alone on one SM (the SM's share of the chip's rates).
    per_cell = compute_seconds(totals, spec, efficiency, 1.0 / spec.sms) / cells
    time_s = compute_s = memory_s = 0.0
    left = cells
    for _ in range(waves):
        in_wave = min(left, per_wave)
        left -= in_wave
        resident = math.ceil(in_wave / spec.sms)  # instances sharing the busiest SM
        hiding = min(1.0, resident * shape.num_warps / c.saturating_warps.value)
        wave_compute = resident * per_cell / hiding
        busy = min(1.0, hiding * in_wave / spec.sms)
        wave_memory = max(moved / _bandwidth(spec), through_l2 / l2_bandwidth) * in_wave / cells / busy
        time_s += max(wave_compute, wave_memory)
        compute_s += wave_compute
        memory_s += wave_memory
    overhead = c.launch_overhead_s.value
    parts = {"compute": compute_s, "memory": memory_s, "overhead": overhead}
    return GpuKernelEstimate(
        name=call.name, grid=list(sample.grid), cells=cells, count=call.count, backend=shape.backend,
        num_warps=shape.num_warps, num_stages=shape.num_stages, smem_bytes=shape.smem_bytes,
        register_bytes=shape.register_bytes,
        occupancy=occupancy, waves=waves, time_ms=(time_s + overhead) * call.count * 1e3,
        compute_ms=compute_s * call.count * 1e3, memory_ms=memory_s * call.count * 1e3,
        overhead_ms=overhead * call.count * 1e3, bound=max(parts, key=parts.__getitem__),  # type: ignore[arg-type]
        bytes=moved * call.count, flops=totals.flops * call.count, dot_flops=totals.mxu_flops * call.count)


def _known_operands(closed: core.ClosedJaxpr, call: PallasCall, task: Task, notes: list[str]) -> dict[int, np.ndarray]:
    """The call's small integer operands (lengths, page tables, group bounds) at ``full`` size, if computable."""
    try:
        return small_operands(closed, call, task)
    except Exception as exc:  # the stubbed re-run can fail on exotic programs: price without them, and say so
        notes.append(f"{call.name}: small integer operands not computed ({type(exc).__name__})")
        return {}


def _xla_parts(cost: XlaCost, spec: GpuSpec) -> tuple[float, float]:
    return compute_seconds(cost.counts, spec, _constants().xla_dot_efficiency.value), cost.bytes / _bandwidth(spec)


def _ideal(counts: OpCounts, spec: GpuSpec, io_bytes: float) -> float:
    return max(compute_seconds(counts, spec, 1.0), io_bytes / spec.hbm_bandwidth)


def _xla_estimate(cost: XlaCost, spec: GpuSpec, io_bytes: float, notes: list[str]) -> GpuModelEstimate:
    compute, memory = _xla_parts(cost, spec)
    c = _constants()
    overhead = c.dispatch_overhead_s.value + c.launch_overhead_s.value
    time_s = max(compute, memory) + overhead
    return GpuModelEstimate(
        target=spec.target, chip=spec.name, kind="xla", time_ms=time_s * 1e3,
        bound="compute" if compute >= memory else "memory", compute_ms=compute * 1e3, memory_ms=memory * 1e3,
        overhead_ms=overhead * 1e3, roofline_fraction=min(1.0, _ideal(cost.counts, spec, io_bytes) / time_s),
        bytes=cost.bytes, flops=cost.counts.flops, dot_flops=cost.counts.mxu_flops,
        notes=[*notes, f"XLA (CPU) cost analysis: {cost.bytes:.4g} bytes accessed"])


def model_gpu_reference(task: Task, chip: str) -> GpuModelEstimate:
    """Modelled cost of the task's reference (plain JAX) at ``full`` size on ``chip``: where it depends on
    the inputs' values, the dearest over the model's draws, as the candidate's is."""
    spec = load_gpu_spec(chip)
    arg_shapes, static, out_shapes = full_shapes(task, "full")
    fn = partial(task.reference, **static)

    def price() -> GpuModelEstimate:
        cost = xla_cost(fn, arg_shapes, partial(small_inputs, task, arg_shapes))
        return _xla_estimate(cost, spec, _io_bytes(arg_shapes, out_shapes), ["reference: XLA roofline"])

    return _dearest(price, any(v is not UNKNOWN for v in small_inputs(task, arg_shapes)))  # type: ignore[return-value]


def model_gpu_candidate(candidate_source: str, task: Task, chip: str,
                        program: core.ClosedJaxpr | None = None) -> GpuModelEstimate:
    """Modelled cost of a candidate at the task's ``full`` size on ``chip`` (TargetError subclasses, one line,
    when it cannot be priced; SmemBudgetError when a kernel overflows shared memory). ``program``: the
    candidate already traced at ``full``, the very program whose twin is checked (traced here when not
    given). A price that depends on the inputs' values is the dearest over the model's draws, as on TPU."""
    spec = load_gpu_spec(chip)
    arg_shapes, static, out_shapes = full_shapes(task, "full")
    if program is None:
        fn = partial(load_candidate(candidate_source).kernel, **static)
        try:
            closed = jax.jit(fn).trace(*arg_shapes).jaxpr
        except Exception as exc:
            raise ModelError(f"candidate does not trace at full size: {type(exc).__name__}: {_first_line(exc)}") from exc
    else:
        closed, fn = program, _program_function(program)
    depends = _depends_on_draws(closed, task, arg_shapes)
    return _dearest(lambda: _price_gpu_program(closed, fn, task, spec, arg_shapes, out_shapes), depends)  # type: ignore[return-value]


def _price_gpu_program(closed: core.ClosedJaxpr, fn: Any, task: Task, spec: GpuSpec, arg_shapes: Any,
                       out_shapes: Any) -> GpuModelEstimate:
    io_bytes = _io_bytes(arg_shapes, out_shapes)
    calls = find_pallas_calls(closed.jaxpr)
    known = partial(small_inputs, task, arg_shapes)
    if not calls:
        return _xla_estimate(xla_cost(fn, arg_shapes, known), spec, io_bytes, ["plain JAX: XLA roofline"])
    notes: list[str] = []
    kernels = [_kernel_estimate(call, spec, notes, known=_known_operands(closed, call, task, notes)) for call in calls]
    try:
        glue = glue_cost(closed, calls, known)
    except TargetError:
        raise
    except Exception as exc:  # code the model cannot price is refused, never counted as free
        raise ModelError(f"the XLA code around the kernels cannot be priced: {type(exc).__name__}: "
                         f"{_first_line(exc)}") from exc
    glue_compute, glue_memory = _xla_parts(glue, spec)
    dispatch = _constants().dispatch_overhead_s.value
    time_s = sum(k.time_ms for k in kernels) / 1e3 + max(glue_compute, glue_memory) + dispatch
    compute = sum(k.compute_ms for k in kernels) / 1e3 + glue_compute
    memory = sum(k.memory_ms for k in kernels) / 1e3 + glue_memory
    overhead = sum(k.overhead_ms for k in kernels) / 1e3 + dispatch
    counts = OpCounts()
    counts.add(glue.counts)
    dot = sum(k.dot_flops for k in kernels) + glue.counts.mxu_flops
    ideal = max(dot / spec.peak_bf16_flops, io_bytes / spec.hbm_bandwidth)
    parts = {"compute": compute, "memory": memory, "overhead": overhead}
    return GpuModelEstimate(
        target=spec.target, chip=spec.name, kind="pallas", time_ms=time_s * 1e3,
        bound=max(parts, key=parts.__getitem__),  # type: ignore[arg-type]
        compute_ms=compute * 1e3, memory_ms=memory * 1e3, overhead_ms=overhead * 1e3,
        roofline_fraction=min(1.0, ideal / time_s), bytes=sum(k.bytes for k in kernels) + glue.bytes,
        flops=sum(k.flops for k in kernels) + glue.counts.flops, dot_flops=dot, kernels=kernels, notes=notes)
