"""What one GPU program instance (a grid cell, one thread block) holds and moves: its backend, warps, the
shared memory its blocks need, and the global-memory bytes its BlockSpec windows cover.

Lowering for CUDA does not depend on the chip and cannot see shared memory or the backend's fit to the
chip, so this module computes them from the kernel's own block shapes and compiler parameters:

- Triton (``plt.CompilerParams``): a BlockSpec only names a window of global memory, and what the body
  loads (ref indexing binds ``get``; ``plt.load``, ``pl.load`` in older JAX, binds ``masked_load``) is held
  as Triton's software pipeliner holds it. The pipeliner multi-buffers only the loads of an innermost loop
  that feed a dot there (directly or through the addresses of such loads), ``num_stages - 1`` buffers deep,
  one more where the dot is Hopper's wgmma, which reads its operands from shared memory. Other dot operands
  pass through shared memory once; a load no dot reads stays in registers, once. (A dot is a wgmma only at
  whole warpgroups and output tiles of 64 rows; a decode kernel's 16-row dots are not.)
- Mosaic GPU (any other parameters, the default): every BlockSpec block is staged in shared memory,
  ``max_concurrent_steps`` buffers deep (1 unless given, and never more than the sequential grid steps),
  plus the kernel's scratch and, where the body reduces, the reduction scratch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from jax._src import core

from maxkernel.targets.blocks import _block_dim
from maxkernel.targets.gpu_spec import Backend, GpuSpec
from maxkernel.targets.jaxpr_walk import sub_jaxprs
from maxkernel.targets.names import TargetError
from maxkernel.targets.ops import REDUCTIONS

LOOP_PRIMITIVES = frozenset({"scan", "while"})
LOAD_PRIMITIVES = frozenset({"get", "masked_load"})
SWAP_PRIMITIVES = frozenset({"swap", "masked_swap"})  # a swap whose old value is read is a load as well
DOT_PRIMITIVES = frozenset({"dot_general"})
MOSAIC_WARPS = 4  # one Mosaic GPU "thread" is a warpgroup of 4 warps
MOSAIC_BUFFERS = 1  # plgpu.CompilerParams.max_concurrent_steps' default
MOSAIC_REDUCTION_SCRATCH = 128 * 4 * 4  # plgpu.CompilerParams.reduction_scratch_bytes' default
TRITON_DEFAULT_WARPS = 4
TRITON_DEFAULT_STAGES = 3
WGMMA_MAJOR = 9  # compute capability from which Triton's dots are wgmma (Hopper; Blackwell taken alike)


class SmemBudgetError(TargetError):
    """A kernel whose program instances need more shared memory than one block may use on the chip."""

    def __init__(self, message: str, smem_bytes: int, budget_bytes: int) -> None:
        super().__init__(message)
        self.smem_bytes = smem_bytes
        self.budget_bytes = budget_bytes


@dataclass(frozen=True)
class ProgramShape:
    """One pallas_call's program instance on a GPU."""

    backend: Backend
    num_warps: int
    num_stages: int
    smem_bytes: int
    load_bytes: int  # global-memory bytes one instance's input windows cover
    store_bytes: int  # and its output windows
    cells: int  # program instances in the grid
    register_bytes: int = 0  # Triton: loaded values no dot reads, held once in registers


def _compiler_params(eqn: core.JaxprEqn) -> list[Any]:
    params = eqn.params.get("compiler_params")
    return [params] if params is not None and not isinstance(params, dict) else list((params or {}).values())


def backend_of(eqn: core.JaxprEqn) -> Backend:
    """The backend a pallas_call lowers through: Triton when given Triton's compiler parameters."""
    return "triton" if any("triton" in type(p).__module__ for p in _compiler_params(eqn)) else "mosaic"


def _param(eqn: core.JaxprEqn, name: str, default: Any) -> Any:
    for p in _compiler_params(eqn):
        value = p.get(name) if isinstance(p, dict) else getattr(p, name, None)
        if value is not None:
            return value
    return default


def _nbytes(aval: Any) -> int:
    shape = tuple(int(d) for d in getattr(aval, "shape", ()))
    return math.prod(shape) * np.dtype(aval.dtype).itemsize


def loaded_bytes(eqn: core.JaxprEqn, used: set[core.Var] | None = None) -> int:
    """Bytes a body equation reads from a ref into a value: 0 for anything else, and for a swap whose old
    value is not among ``used`` (a plain store; None: every value taken as used)."""
    name = eqn.primitive.name
    if not eqn.outvars or name not in LOAD_PRIMITIVES | SWAP_PRIMITIVES:
        return 0
    out = eqn.outvars[0]
    if name in SWAP_PRIMITIVES and (isinstance(out, core.DropVar) or (used is not None and out not in used)):
        return 0
    return _nbytes(out.aval)


def _used(jaxpr: core.Jaxpr) -> set[core.Var]:
    """The variables some equation of ``jaxpr`` reads, or it returns."""
    found = {v for eqn in jaxpr.eqns for v in eqn.invars if isinstance(v, core.Var)}
    return found | {v for v in jaxpr.outvars if isinstance(v, core.Var)}


def _has_loop(jaxpr: core.Jaxpr) -> bool:
    return any(eqn.primitive.name in LOOP_PRIMITIVES or any(_has_loop(sub) for _, sub in sub_jaxprs(eqn))
               for eqn in jaxpr.eqns)


def _contains_dot(eqn: core.JaxprEqn) -> bool:
    return eqn.primitive.name in DOT_PRIMITIVES or any(
        _contains_dot(inner) for _, sub in sub_jaxprs(eqn) for inner in sub.eqns)


@dataclass
class DotLoad:
    """A load that feeds a dot: its indirection level (None where it sits at two), and whether a wgmma dot
    reads it directly."""

    level: int | None
    wgmma: bool = False


def is_wgmma(eqn: core.JaxprEqn, warps: int) -> bool:
    """Whether Triton makes a dot a Hopper wgmma (MMAv3): a 2-D product, whole warpgroups, output rows a
    multiple of 64 and columns of 8; any other dot is an Ampere-style mma, whose operands sit in registers."""
    if eqn.primitive.name not in DOT_PRIMITIVES:
        return False
    shape = tuple(int(d) for d in eqn.outvars[0].aval.shape)
    return len(shape) == 2 and warps % 4 == 0 and shape[0] % 64 == 0 and shape[1] % 8 == 0


def dot_loads(jaxpr: core.Jaxpr, warps: int = TRITON_DEFAULT_WARPS) -> dict[int, DotLoad]:
    """Loads of ``jaxpr`` (by equation index) that feed one of its dots, traced back through the values the
    dots read: level 0 where the dot reads the loaded value, 1 where that load's address (a page index) was
    itself loaded, and so on. An equation holding a dot in a sub-program counts as a dot over all its
    operands (taken as an mma)."""
    defining = {v: i for i, eqn in enumerate(jaxpr.eqns) for v in eqn.outvars if not isinstance(v, core.DropVar)}
    found: dict[int, DotLoad] = {}

    def visit(index: int, level: int, wgmma: bool, seen: set[int]) -> None:
        if index in seen:
            return
        seen.add(index)
        eqn = jaxpr.eqns[index]
        if loaded_bytes(eqn):
            known = found.setdefault(index, DotLoad(level))
            if known.level != level:
                known.level = None
            known.wgmma = known.wgmma or (wgmma and level == 0)
            level += 1
        for v in eqn.invars:
            if isinstance(v, core.Var) and v in defining:
                visit(defining[v], level, wgmma, seen)

    for eqn in jaxpr.eqns:
        if _contains_dot(eqn):
            wgmma, seen = is_wgmma(eqn, warps), set[int]()
            for v in eqn.invars:
                if isinstance(v, core.Var) and v in defining:
                    visit(defining[v], 0, wgmma, seen)
    return found


def _small(eqn: core.JaxprEqn) -> bool:
    """A load Triton will not pipeline: a scalar, or rows under the 4 bytes an async copy moves at least."""
    aval = eqn.outvars[0].aval
    shape = tuple(int(d) for d in getattr(aval, "shape", ()))
    return not shape or shape[-1] * np.dtype(aval.dtype).itemsize < 4


@dataclass
class _TritonBytes:
    smem: int = 0
    registers: int = 0


def _triton_bytes(jaxpr: core.Jaxpr, loop_body: bool, stages: int, warps: int, hopper: bool,
                  into: _TritonBytes) -> None:
    """Shared memory and registers the loads of a Triton body hold, per the pipeliner's rule (module doc)."""
    pipelined = loop_body and stages > 1 and not _has_loop(jaxpr)  # Triton pipelines innermost loops only
    loads, used = dot_loads(jaxpr, warps), _used(jaxpr)
    for i, eqn in enumerate(jaxpr.eqns):
        nbytes = loaded_bytes(eqn, used)
        if nbytes and i in loads:
            load = loads[i]
            deep = pipelined and load.level is not None and load.level < stages - 1 and not _small(eqn)
            into.smem += nbytes * ((stages - 1 + int(hopper and load.wgmma)) if deep else 1)
        elif nbytes:
            into.registers += nbytes
        name = eqn.primitive.name
        for key, sub in sub_jaxprs(eqn):
            if name == "while" and key != "body_jaxpr":
                inner = False  # a loop's condition is no part of its pipelined body
            elif name in LOOP_PRIMITIVES:
                inner = True
            elif name == "cond":
                inner = False  # a branch is its own block: the pipeliner does not reach into it
            else:
                inner = loop_body  # called programs are inlined into the block they sit in
            _triton_bytes(sub, inner, stages, warps, hopper, into)


def triton_bytes(jaxpr: core.Jaxpr, stages: int, warps: int, hopper: bool) -> tuple[int, int]:
    """(shared-memory bytes, register bytes) one Triton program instance's loads hold; ``hopper``: the chip
    runs wgmma."""
    found = _TritonBytes()
    _triton_bytes(jaxpr, False, stages, warps, hopper, found)
    return found.smem, found.registers


def _reduces(jaxpr: core.Jaxpr) -> bool:
    return any(eqn.primitive.name in REDUCTIONS or any(_reduces(sub) for _, sub in sub_jaxprs(eqn))
               for eqn in jaxpr.eqns)


def _mosaic_buffers(eqn: core.JaxprEqn, grid: tuple[int, ...]) -> int:
    """Buffers per block: ``max_concurrent_steps``, no more than the steps of the grid's sequential axes."""
    semantics = _param(eqn, "dimension_semantics", None)
    sequential = [g for g, s in zip(grid, semantics or ()) if str(getattr(s, "value", s)).lower() != "parallel"]
    return max(1, min(int(_param(eqn, "max_concurrent_steps", MOSAIC_BUFFERS)), math.prod(sequential)))


def _block_bytes(bm: Any) -> int:
    shape = [_block_dim(d) for d in bm.block_shape]
    return math.prod(shape) * np.dtype(bm.array_aval.dtype).itemsize


def program_shape(eqn: core.JaxprEqn, spec: GpuSpec) -> ProgramShape:
    """The program instance of a call on ``spec``'s chip (the chip decides whether Triton's dots are wgmma)."""
    grid_mapping = eqn.params["grid_mapping"]
    backend = backend_of(eqn)
    mappings = list(grid_mapping.block_mappings)
    ins, outs = mappings[: grid_mapping.num_inputs], mappings[grid_mapping.num_inputs:]
    loads = sum(_block_bytes(bm) for bm in ins)
    stores = sum(_block_bytes(bm) for bm in outs)
    grid = tuple(int(g) for g in grid_mapping.grid)
    cells = math.prod(grid) if grid else 1
    kernel = eqn.params["jaxpr"]
    if backend == "triton":
        warps = int(_param(eqn, "num_warps", TRITON_DEFAULT_WARPS))
        stages = int(_param(eqn, "num_stages", TRITON_DEFAULT_STAGES))
        hopper = int(spec.compute_capability.split(".")[0]) >= WGMMA_MAJOR
        smem, registers = triton_bytes(kernel, stages, warps, hopper)
        return ProgramShape(backend, warps, stages, smem, loads, stores, cells, registers)
    stages = _mosaic_buffers(eqn, grid)
    scratch = kernel.invars[len(mappings) + grid_mapping.num_index_operands:]
    reduction = int(_param(eqn, "reduction_scratch_bytes", MOSAIC_REDUCTION_SCRATCH)) if _reduces(kernel) else 0
    smem = stages * (loads + stores) + sum(_nbytes(v.aval) for v in scratch) + reduction
    return ProgramShape(backend, MOSAIC_WARPS, stages, smem, loads, stores, cells)


def check_smem(eqn: core.JaxprEqn, name: str, spec: GpuSpec) -> ProgramShape:
    """The program shape of a call, refused (SmemBudgetError) where one instance overflows shared memory."""
    shape = program_shape(eqn, spec)
    if shape.smem_bytes > spec.smem_per_block:
        raise SmemBudgetError(
            f"kernel {name} needs {shape.smem_bytes} bytes of shared memory per block "
            f"({shape.backend}, {shape.num_stages} stages) but {spec.target} allows {spec.smem_per_block}",
            shape.smem_bytes, spec.smem_per_block)
    return shape


def resident_blocks(shape: ProgramShape, spec: GpuSpec) -> int:
    """Program instances one SM holds at once: limited by warps, shared memory and the block limit."""
    by_warps = spec.max_warps_per_sm // max(shape.num_warps, 1)
    by_smem = spec.smem_per_sm // shape.smem_bytes if shape.smem_bytes else spec.max_blocks_per_sm
    return max(1, min(by_warps, by_smem, spec.max_blocks_per_sm))
