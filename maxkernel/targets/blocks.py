"""What a pallas_call's grid and BlockSpecs move: block bytes, VMEM footprint, and HBM traffic per grid step.

The Pallas TPU pipeline walks the grid in row-major order. Before step ``t`` it fetches every input block
whose block index differs from step ``t-1`` (an unchanged block stays in VMEM) and writes back every output
block whose index is about to change; the first step's inputs are fetched up front and the last step's
outputs written at the end. Index maps are evaluated at the steps of a :class:`GridSample` (all steps, or a
fixed-seed sample of them on large grids) in one vectorised call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from jax._src import core
from jax._src.state import discharge

from maxkernel.targets.grid import GridSample
from maxkernel.targets.names import TargetError
from maxkernel.targets.specs import TpuSpec

LANES = 128
SUBLANES = 8

_HBM_SPACES = ("any", "hbm")


def memory_space(aval: object) -> str:
    space = getattr(aval, "memory_space", None)
    return str(getattr(space, "value", space)).lower()


def sublane_rows(*dtypes: Any) -> int:
    """Rows of the TPU's (sublane, lane) VMEM tile for the narrowest of ``dtypes``: 8 of 32 bits, 16 of
    bfloat16, 32 of int8; a row block that is not the whole extent must be a multiple of it."""
    return SUBLANES * max(1, 4 // min(np.dtype(d).itemsize for d in dtypes))


def padded_bytes(shape: tuple[int, ...], dtype: np.dtype) -> int:
    """Bytes of an array laid out in VMEM tiles: the last dim rounded up to 128 lanes, the second-last to 8
    sublanes of 32 bits (16 rows of bf16, 32 of int8); a 1-D array to 128 lanes."""
    itemsize = np.dtype(dtype).itemsize
    if not shape:
        return itemsize
    if len(shape) == 1:
        return -(-shape[0] // LANES) * LANES * itemsize
    sublanes = sublane_rows(dtype)
    rows = -(-shape[-2] // sublanes) * sublanes
    cols = -(-shape[-1] // LANES) * LANES
    return math.prod(shape[:-2]) * rows * cols * itemsize


@dataclass
class Block:
    """One BlockSpec of a pallas_call (input or output)."""

    origin: str
    is_output: bool
    space: str  # "vmem", "smem" (pipelined by Pallas) or "any"/"hbm" (left in HBM for manual DMA)
    block_shape: tuple[int, ...]
    block_bytes: int
    buffers: int
    vmem_bytes: int

    @property
    def pipelined(self) -> bool:
        return self.space not in _HBM_SPACES


def _block_dim(dim: object) -> int:
    if dim is None:
        return 1
    size = getattr(dim, "block_size", None)
    return 1 if size is None else int(size)  # Squeezed has no size: one element


def blocks_of(grid_mapping: object) -> list[Block]:
    """The pipelined and HBM-resident operands of a pallas_call, in order inputs then outputs."""
    out = []
    n_in = grid_mapping.num_inputs  # type: ignore[attr-defined]
    for i, bm in enumerate(grid_mapping.block_mappings):  # type: ignore[attr-defined]
        dtype = bm.array_aval.dtype
        shape = tuple(_block_dim(d) for d in bm.block_shape)
        space = memory_space(bm.transformed_block_aval)
        space = "vmem" if space in ("default", "none", "vmem") else space
        buffers = getattr(bm.pipeline_mode, "buffer_count", None) or 2
        ref_shape = tuple(bm.transformed_block_aval.shape)
        vmem = buffers * padded_bytes(ref_shape, dtype) if space == "vmem" else 0
        out.append(Block(
            origin=str(bm.origin), is_output=i >= n_in, space=space, block_shape=shape,
            block_bytes=math.prod(shape) * np.dtype(dtype).itemsize, buffers=buffers, vmem_bytes=vmem,
        ))
    return out


def scratch_vmem_bytes(grid_mapping: object) -> int:
    """VMEM of the kernel's scratch buffers (single-buffered); semaphores and SMEM cost none."""
    total = 0
    for aval in grid_mapping.scratch_avals:  # type: ignore[attr-defined]
        if memory_space(aval) in ("vmem", "default") and hasattr(aval, "dtype"):
            total += padded_bytes(tuple(aval.shape), aval.dtype)
    return total


class VmemBudgetError(TargetError):
    """A kernel needs more VMEM than the generation allows: it would not compile on that TPU."""

    def __init__(self, message: str, kernel: str, vmem_bytes: int, budget_bytes: int) -> None:
        super().__init__(message)
        self.kernel = kernel
        self.vmem_bytes = vmem_bytes
        self.budget_bytes = budget_bytes


def kernel_vmem(eqn: core.JaxprEqn, spec: TpuSpec) -> tuple[int, int]:
    """(VMEM footprint, VMEM budget) of one pallas_call: buffered blocks plus scratch, against the limit
    the kernel sets in ``CompilerParams(vmem_limit_bytes=...)`` or the generation's default."""
    grid_mapping = eqn.params["grid_mapping"]
    used = sum(b.vmem_bytes for b in blocks_of(grid_mapping)) + scratch_vmem_bytes(grid_mapping)
    return used, spec.vmem_budget(compiler_param(eqn, "vmem_limit_bytes"))


def check_vmem(eqn: core.JaxprEqn, kernel: str, spec: TpuSpec) -> tuple[int, int]:
    """:func:`kernel_vmem`, raising VmemBudgetError when the footprint exceeds the budget."""
    used, budget = kernel_vmem(eqn, spec)
    if used > budget:
        raise VmemBudgetError(f"kernel {kernel} needs {used} bytes of VMEM (blocks double-buffered plus scratch); "
                              f"the {spec.target} budget is {budget} bytes", kernel, used, budget)
    return used, budget


def compiler_param(eqn: core.JaxprEqn, name: str) -> Any:
    params = eqn.params.get("compiler_params")
    if isinstance(params, dict):  # older spelling: {"mosaic": {...}}
        return params.get("mosaic", params).get(name)
    return getattr(params, name, None)


@dataclass
class StepTraffic:
    """HBM<->VMEM bytes of the pipelined blocks, step by step."""

    first_bytes: float  # inputs fetched before step 0
    last_bytes: float  # outputs written after the last step
    step_bytes: np.ndarray  # bytes moved around each sampled step t >= 1 (inputs of t, outputs of t - 1)
    weight: float  # real steps each entry of step_bytes stands for
    notes: list[str] = field(default_factory=list)

    @property
    def total_bytes(self) -> float:
        return self.first_bytes + self.last_bytes + self.weight * float(self.step_bytes.sum())


def step_traffic(grid_mapping: object, sample: GridSample, prefetch: list[np.ndarray] | None) -> StepTraffic:
    """Bytes moved per grid step. ``prefetch`` holds the scalar-prefetch operands' values (None: unknown)."""
    blocks = blocks_of(grid_mapping)
    first = float(sum(b.block_bytes for b in blocks if b.pipelined and not b.is_output))
    last = float(sum(b.block_bytes for b in blocks if b.pipelined and b.is_output))
    moved = np.zeros(len(sample.t))
    if len(sample.t) == 0:
        return StepTraffic(first, last, moved, sample.weight)
    changed, notes = _changed_blocks(grid_mapping, sample, prefetch)
    for block, mask in zip(blocks, changed):
        if block.pipelined:
            moved += mask * block.block_bytes
    return StepTraffic(first, last, moved, sample.weight, notes)


def uses_refs(jaxpr: core.Jaxpr, first_ref: int) -> bool:
    """Whether any equation reads one of ``jaxpr.invars[first_ref:]`` (the scalar-prefetch refs)."""
    refs = set(jaxpr.invars[first_ref:])
    return any(v in refs for eqn in jaxpr.eqns for v in eqn.invars if isinstance(v, core.Var))


def _changed_blocks(grid_mapping: object, sample: GridSample,
                    prefetch: list[np.ndarray] | None) -> tuple[list[np.ndarray], list[str]]:
    """For every block mapping, whether its block index at step t differs from step t - 1."""
    n_grid = len(sample.grid)
    index_avals = grid_mapping.index_map_avals[n_grid:]  # type: ignore[attr-defined]
    values = prefetch if prefetch is not None else [np.zeros(a.shape, a.dtype) for a in index_avals]
    notes: list[str] = []
    maps, unknown = [], []
    for bm in grid_mapping.block_mappings:  # type: ignore[attr-defined]
        closed = bm.index_map_jaxpr
        unknown.append(prefetch is None and uses_refs(closed.jaxpr, n_grid))
        maps.append((discharge.discharge_state(closed) if index_avals else closed, len(closed.out_avals)))
        if unknown[-1]:
            notes.append(f"{bm.origin}: index map reads scalar-prefetch values that could not be computed; "
                         "assumed re-fetched every step")
    sizes = [n_out for _, n_out in maps]

    def all_indices(grid_ids: list, refs: list) -> list:
        outs = []
        for pure, n_out in maps:
            outs.extend(core.eval_jaxpr(pure.jaxpr, pure.consts, *grid_ids, *refs)[:n_out])
        return outs

    _, before, after = sample.evaluate(all_indices, values)
    changed, pos = [], 0
    for n_out, is_unknown in zip(sizes, unknown):
        prev, cur = before[pos:pos + n_out], after[pos:pos + n_out]
        pos += n_out
        if is_unknown:
            changed.append(np.ones(len(sample.t), dtype=bool))
        elif n_out == 0:
            changed.append(np.zeros(len(sample.t), dtype=bool))
        else:
            changed.append(np.any(np.stack(prev) != np.stack(cur), axis=0))
    return changed, notes
