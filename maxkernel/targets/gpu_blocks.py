"""What one GPU program instance (a grid cell, one thread block) holds and moves: its backend, warps, the
shared memory its blocks need, and the global-memory bytes its BlockSpec windows cover.

Lowering for CUDA does not depend on the chip and cannot see shared memory or the backend's fit to the
chip, so this module computes them from the kernel's own block shapes and compiler parameters:

- Triton (``plt.CompilerParams``): a BlockSpec only names a window of global memory; what the body loads
  inside a loop is software-pipelined ``num_stages`` deep through shared memory, loads outside loops once.
- Mosaic GPU (any other parameters, the default): every pipelined BlockSpec block is staged in shared memory
  with two buffers, plus the kernel's scratch.
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

LOOP_PRIMITIVES = frozenset({"scan", "while"})
MOSAIC_WARPS = 4  # one Mosaic GPU "thread" is a warpgroup of 4 warps
MOSAIC_BUFFERS = 2
TRITON_DEFAULT_WARPS = 4
TRITON_DEFAULT_STAGES = 3


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


def backend_of(eqn: core.JaxprEqn) -> Backend:
    """The backend a pallas_call lowers through: Triton when given Triton's compiler parameters."""
    params = eqn.params.get("compiler_params")
    found = [params] if params is not None and not isinstance(params, dict) else list((params or {}).values())
    return "triton" if any("triton" in type(p).__module__ for p in found) else "mosaic"


def _param(eqn: core.JaxprEqn, name: str, default: int) -> int:
    params = eqn.params.get("compiler_params")
    found = [params] if params is not None and not isinstance(params, dict) else list((params or {}).values())
    for p in found:
        value = p.get(name) if isinstance(p, dict) else getattr(p, name, None)
        if value is not None:
            return int(value)
    return default


def _nbytes(aval: Any) -> int:
    shape = tuple(int(d) for d in getattr(aval, "shape", ()))
    return math.prod(shape) * np.dtype(aval.dtype).itemsize


def _loads(jaxpr: core.Jaxpr, in_loop: bool, stages: int) -> int:
    """Shared memory of a Triton body: ref loads inside loops ``stages`` deep, loads outside once."""
    total = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in ("get", "load") and eqn.outvars:
            total += _nbytes(eqn.outvars[0].aval) * (stages if in_loop else 1)
        for _, sub in sub_jaxprs(eqn):
            total += _loads(sub, in_loop or eqn.primitive.name in LOOP_PRIMITIVES, stages)
    return total


def _block_bytes(bm: Any) -> int:
    shape = [_block_dim(d) for d in bm.block_shape]
    return math.prod(shape) * np.dtype(bm.array_aval.dtype).itemsize


def program_shape(eqn: core.JaxprEqn) -> ProgramShape:
    grid_mapping = eqn.params["grid_mapping"]
    backend = backend_of(eqn)
    mappings = list(grid_mapping.block_mappings)
    ins, outs = mappings[: grid_mapping.num_inputs], mappings[grid_mapping.num_inputs:]
    loads = sum(_block_bytes(bm) for bm in ins)
    stores = sum(_block_bytes(bm) for bm in outs)
    cells = math.prod(int(g) for g in grid_mapping.grid) if grid_mapping.grid else 1
    if backend == "triton":
        warps = _param(eqn, "num_warps", TRITON_DEFAULT_WARPS)
        stages = _param(eqn, "num_stages", TRITON_DEFAULT_STAGES)
        smem = _loads(eqn.params["jaxpr"], False, stages)
    else:
        warps, stages = MOSAIC_WARPS, _param(eqn, "max_concurrent_steps", MOSAIC_BUFFERS)
        scratch = eqn.params["jaxpr"].invars[len(mappings) + grid_mapping.num_index_operands:]
        smem = stages * (loads + stores) + sum(_nbytes(v.aval) for v in scratch)
    return ProgramShape(backend, warps, stages, smem, loads, stores, cells)


def check_smem(eqn: core.JaxprEqn, name: str, spec: GpuSpec) -> ProgramShape:
    """The program shape of a call, refused (SmemBudgetError) where one instance overflows shared memory."""
    shape = program_shape(eqn)
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
