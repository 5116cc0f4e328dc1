"""Grouped matmul (Megablox GMM, ``ragged_dot``) for NVIDIA GPUs in Pallas (Triton).

A GPU has no scalar prefetch, and its program instances run concurrently, so two instances must never
write the same output tile. The grid is (row tile, column tile); a few tiny XLA ops compute, from the
group sizes at run time, each row tile's first group and how many groups its rows touch, and each group's
first and last row + 1. Each instance loops over its tile's groups: per group, a K loop of (bm, bk) x
(bk, bn) tensor-core dots into an f32 accumulator, whose rows that belong to the group are kept. The tile
is written once. Work follows the groups: every tile multiplies once per group it touches (tiles +
groups - 1 tile products in all, at most), never all groups.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from maxkernel.analysis.program import arg_names
from maxkernel.rewrites.emit import EmitError, dtype_expr
from maxkernel.templates.base import FIT_SOURCE, TemplateSpace
from maxkernel.templates.gmm import GroupedShape, analyse
from maxkernel.templates.gpu_base import (
    GPU_STAGES,
    GPU_WARPS,
    TRITON_SMEM_PLAN,
    backend_import,
    compiler_params_text,
    gpu_target,
)

if TYPE_CHECKING:
    from jaxbench.task import Task
    from maxkernel.analysis import TaskAnalysis

TILE_BLOCKS = (32, 64, 128, 256)
DEPTH_BLOCKS = (16, 32, 64, 128)


def smem_bytes(a: GroupedShape, bm: int, bn: int, bk: int, stages: int) -> int:
    """Shared memory of one instance: the lhs and rhs slices its K loop loads, ``stages`` deep."""
    return stages * (bm * bk + bk * bn) * a.dtype.itemsize


def _divides(block: int, *extents: int) -> bool:
    return all(e % block == 0 for e in extents)


class GpuGroupedMatmulTemplate:
    name = "gpu_grouped_matmul"
    description = ("grouped matmul for GPUs: a program per output tile loops over the groups its rows touch, "
                   "a K loop of tensor-core dots per group, each group's rows kept, one store")

    def applies(self, task: "Task", analysis: "TaskAnalysis") -> str | None:
        shapes = [analyse(task, size) for size in ("cpu", "full")]
        failed = next((s for s in shapes if isinstance(s, str)), None)
        if failed is not None:
            return failed
        if not any(_divides(b, *(s.m for s in shapes)) for b in TILE_BLOCKS):  # type: ignore[union-attr]
            return "no power-of-two row tile divides the rows"
        return None

    def space(self, task: "Task", analysis: "TaskAnalysis", target: str) -> TemplateSpace:
        found = [analyse(task, size) for size in ("cpu", "full")]
        shapes = [s for s in found if not isinstance(s, str)]
        a = shapes[-1] if gpu_target(target) else shapes[0]
        ms, ns, ks = [s.m for s in shapes], [s.n for s in shapes], [s.k for s in shapes]
        fits = [(bm, bn, bk, st) for bm in TILE_BLOCKS if _divides(bm, *ms) for bn in TILE_BLOCKS if _divides(bn, *ns)
                for bk in DEPTH_BLOCKS if _divides(bk, *ks) for st in GPU_STAGES
                if smem_bytes(a, bm, bn, bk, st) <= TRITON_SMEM_PLAN]
        space = {"block_m": sorted({f[0] for f in fits}), "block_n": sorted({f[1] for f in fits}),
                 "block_k": sorted({f[2] for f in fits}), "num_warps": list(GPU_WARPS),
                 "num_stages": sorted({f[3] for f in fits}), "backend": ["triton"]}
        # Default: the matmul tutorial's 128x128 tile with a 64-deep bf16 slice, 3 stages (or the closest fit).
        best = min(fits, key=lambda f: (abs(f[0] - 128) + abs(f[1] - 128) + abs(f[2] - 64), abs(f[3] - 3)))
        defaults = {"block_m": best[0], "block_n": best[1], "block_k": best[2], "num_warps": 4,
                    "num_stages": best[3], "backend": "triton"}
        return TemplateSpace(defaults=defaults, space=space)

    def render(self, task: "Task", params: dict[str, Any], sizes: tuple[str, ...]) -> str:
        backend = str(params.get("backend", "triton"))
        if backend != "triton":
            raise EmitError("the GPU grouped matmul template emits Triton bodies only")
        shapes = [analyse(task, size) for size in sizes]
        failed = next((s for s in shapes if isinstance(s, str)), None)
        if failed is not None:
            raise EmitError(failed)
        found = [s for s in shapes if not isinstance(s, str)]
        if len({(s.dtype, s.out_dtype, tuple(s.names.items())) for s in found}) != 1:
            raise EmitError("argument roles or dtypes that change with size")
        compiler = compiler_params_text(backend, int(params["num_warps"]), int(params["num_stages"]))
        return render_source(task, found[0], int(params["block_m"]), int(params["block_n"]), int(params["block_k"]),
                             backend, compiler)


def render_source(task: "Task", a: GroupedShape, bm: int, bn: int, bk: int, backend: str, compiler: str) -> str:
    lhs, rhs, sizes = a.names["lhs"], a.names["rhs"], a.names["group_sizes"]
    return f'''"""{task.id}: grouped matmul for NVIDIA GPUs ({backend}): a program per output tile loops over the groups
its rows touch (from the group sizes at run time), a K loop of dots per group, and keeps each group's rows.
{compiler}. Generated by MaxKernel's rules brain."""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
{backend_import(backend)}

BLOCK_M = {bm}  # rows per tile
BLOCK_N = {bn}  # output columns per tile
BLOCK_K = {bk}  # depth per loop trip


{FIT_SOURCE}


def _tile_groups(group_sizes, rows, block_m):
    """Per row tile: its first group and how many groups its rows touch; per group: first and last row + 1."""
    ends = jnp.cumsum(group_sizes).astype(jnp.int32)
    starts = ends - group_sizes.astype(jnp.int32)
    tile_start = jnp.arange(rows // block_m, dtype=jnp.int32) * block_m
    first = jnp.searchsorted(ends, tile_start, side="right").astype(jnp.int32)
    last = jnp.searchsorted(starts, tile_start + block_m, side="left").astype(jnp.int32) - 1
    return first, jnp.maximum(last - first + 1, 0), starts, ends


def _gmm_body(first_ref, count_ref, starts_ref, ends_ref, lhs_ref, rhs_ref, o_ref, *, bm, bk, depth):
    i = pl.program_id(0)
    rows = i * bm + jax.lax.broadcasted_iota(jnp.int32, (bm, 1), 0)
    first = first_ref[0]

    def group(t, out):
        g = first + t

        def step(kk, acc):
            x = lhs_ref[:, pl.ds(kk * bk, bk)]
            w = rhs_ref[g, pl.ds(kk * bk, bk), :]
            return acc + jnp.dot(x, w, preferred_element_type=jnp.float32)

        acc = jax.lax.fori_loop(0, depth // bk, step, jnp.zeros(out.shape, jnp.float32))
        mine = (rows >= starts_ref[g]) & (rows < ends_ref[g])
        return jnp.where(mine, acc, out)

    out = jax.lax.fori_loop(0, count_ref[0], group, jnp.zeros(o_ref.shape, jnp.float32))
    o_ref[...] = out.astype(o_ref.dtype)


def kernel({", ".join(arg_names(task)[:3])}):
    rows, depth = {lhs}.shape
    groups, _, cols = {rhs}.shape
    bm, bn, bk = _fit(BLOCK_M, rows), _fit(BLOCK_N, cols), _fit(BLOCK_K, depth)
    first, count, starts, ends = _tile_groups({sizes}, rows, bm)
    body = functools.partial(_gmm_body, bm=bm, bk=bk, depth=depth)
    return pl.pallas_call(
        body,
        grid=(rows // bm, cols // bn),
        in_specs=[
            pl.BlockSpec((1,), lambda i, j: (i,)),
            pl.BlockSpec((1,), lambda i, j: (i,)),
            pl.BlockSpec((groups,), lambda i, j: (0,)),
            pl.BlockSpec((groups,), lambda i, j: (0,)),
            pl.BlockSpec((bm, depth), lambda i, j: (i, 0)),
            pl.BlockSpec((groups, depth, bn), lambda i, j: (0, 0, j)),
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((rows, cols), {dtype_expr(a.out_dtype)}),
        compiler_params={compiler},
    )(first, count, starts, ends, {lhs}, {rhs})
'''


GPU_GROUPED_MATMUL = GpuGroupedMatmulTemplate()
