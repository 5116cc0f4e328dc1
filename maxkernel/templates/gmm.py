"""Grouped matmul (Megablox GMM, ``ragged_dot``) as a Pallas kernel: group metadata by scalar prefetch.

Rows of ``lhs`` are sorted by group; group g multiplies its rows by ``rhs[g]``. The group sizes are data,
so the candidate computes at run time (a few tiny XLA ops) the list of (row tile, group) pairs that share
a row, in order: at most ``tiles + groups - 1`` of them, a bound known from shapes alone, which sizes the
metadata arrays; their real count, also computed at run time, is the grid's visit extent, so no step is
spent on visits that do not exist (a static grid of the bound pays a block fetch and a step for each). The
grid is (column tile, visit, depth tile) with depth innermost: each visit multiplies its row
tile by its group's weight tile into an f32 VMEM accumulator and, on the last depth step, writes the rows
that belong to the group; a tile that straddles a boundary is visited once per group, consecutively, so
its output block stays in VMEM until every group has written its rows. MXU operands stay in the input dtype.
Blocks follow the tuned table's rule (``block_for``) at any shape. Rows are tiled by it where it finds a
legal divisor near the tuned tile, else padded to whole tuned tiles: group boundaries fall anywhere anyway,
so the padded rows are rows no group owns, and they are cut from the output. Depth is tiled exactly (an
extent with no legal divisor is refused by name); the column axis counts partial tiles (a last tile past
the end writes only the columns that exist), so the check size can halve ``n`` without changing the
column tile.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from maxkernel.analysis.program import arg_names, trace_program
from maxkernel.rewrites.emit import EmitError, dtype_expr
from maxkernel.targets.check_size import CHECK_FLOPS, CHECK_GRID_STEPS
from maxkernel.targets.blocks import LANES, sublane_rows
from maxkernel.templates.base import (BLOCK_FOR_SOURCE, TPU_VMEM_BUDGET, TemplateSpace, check_extent, check_floor,
                                      divisors, tpu_target)

if TYPE_CHECKING:
    from jaxbench.task import Task
    from maxkernel.analysis import TaskAnalysis
    from maxkernel.targets.specs import TpuSpec

TPU_BLOCKS_M = (128, 256, 512, 1024)
TPU_BLOCKS_KN = (256, 512, 1024, 2048)


@dataclass
class GroupedShape:
    m: int
    k: int
    n: int
    groups: int
    dtype: Any
    out_dtype: Any
    names: dict[str, str]  # role (lhs, rhs, group_sizes) -> argument name


def analyse(task: "Task", size: str) -> GroupedShape | str:
    from maxkernel.rewrites.grouped import match_grouped  # it imports the template registry

    program = trace_program(task, size).dce()
    roles = match_grouped(program)
    if isinstance(roles, str):
        return roles
    by_name = {v.name: v for v in program.inputs}
    lhs, rhs = by_name[roles.lhs], by_name[roles.rhs]
    return GroupedShape(lhs.shape[0], lhs.shape[1], rhs.shape[2], rhs.shape[0], np.dtype(lhs.dtype),
                        np.dtype(roles.out_dtype),
                        {"lhs": roles.lhs, "rhs": roles.rhs, "group_sizes": roles.group_sizes})


def vmem_bytes(a: GroupedShape, bm: int, bk: int, bn: int) -> int:
    """Double-buffered lhs, rhs and output blocks plus the f32 accumulator."""
    item, out = a.dtype.itemsize, a.out_dtype.itemsize
    return 2 * (bm * bk * item + bk * bn * item + bm * bn * out) + bm * bn * 4


def visits(a: GroupedShape, bm: int) -> int:
    """The most visits there can be (the grid runs the real count): every (row tile, group) pair that can
    share a row."""
    return a.m // bm + a.groups - 1


def check_footprint(a: GroupedShape, floors: tuple[int, int, int], bm: int, bk: int, bn: int) -> tuple[float, int]:
    """(reference FLOPs, grid steps) at the smallest twin of ``a`` for these tiles, as the evaluator's check
    size finds it. The FLOPs are those of a dense grouped product (every row by every group's weights: the
    11p reference, and how XLA:CPU counts ``ragged_dot``), an upper bound for any grouped reference; the steps
    count the visit axis at its bound (the real count is data)."""
    m = check_extent(a.m, floors[0], bm, lambda rows: rows // bm + a.groups - 1)
    k = check_extent(a.k, floors[1], bk, lambda depth: depth // bk)
    n = column_check_extent(a.n, floors[2], bn)
    return 2.0 * a.groups * m * k * n, column_tiles(n, bn) * (m // bm + a.groups - 1) * (k // bk)


def column_tiles(cols: int, bn: int) -> int:
    """Grid extent of the column axis: the last tile may be partial (its columns past the end are dropped)."""
    return -(-cols // bn)


def column_check_extent(full: int, floor: int, bn: int) -> int:
    """The smallest halving of ``full`` (not below ``floor``) that keeps the column tile ``bn`` whole and two
    column steps where ``full`` has two. Column tiles need not divide the extent (a partial last tile), so
    the check can halve ``n`` past where ``bn`` stops dividing it, as it does for JAX's megablox gmm."""
    need_two = column_tiles(full, bn) >= 2
    chosen, current = full, full
    while current % 2 == 0 and current // 2 >= floor:
        current //= 2
        if current < bn or (need_two and column_tiles(current, bn) < 2):
            break
        chosen = current
    return chosen


def pipeline_s(spec: "TpuSpec", a: GroupedShape, bm: int, bk: int, bn: int) -> float:
    """The template's grid pipeline at ``a``: per step the larger of its MXU work and its lhs and rhs block
    fetches (the output block once a visit), plus the step overhead. A first guess that picks the default;
    the tuner then ranks the space with the full cost model."""
    item, out = a.dtype.itemsize, a.out_dtype.itemsize
    bandwidth = 0.9 * spec.hbm_bandwidth
    depth_steps = a.k // bk
    compute = 2.0 * bm * bk * bn / spec.peak_bf16_flops
    memory = ((bm * bk + bk * bn) * item + bm * bn * out / depth_steps) / bandwidth
    return column_tiles(a.n, bn) * visits(a, bm) * depth_steps * (max(compute, memory) + spec.step_overhead_s)


def check_floors(task: "Task", a: GroupedShape, small: GroupedShape) -> tuple[int, int, int]:
    """How far the check may shrink m, k and n (see ``check_floor``)."""
    return (check_floor(task, a.m, small.m), check_floor(task, a.k, small.k), check_floor(task, a.n, small.n))


class GroupedMatmulTemplate:
    name = "grouped_matmul"
    description = "grouped matmul over (row tile, group) visits from scalar-prefetched group metadata"

    def applies(self, task: "Task", analysis: "TaskAnalysis") -> str | None:
        found = analyse(task, "cpu")
        return found if isinstance(found, str) else None

    def space(self, task: "Task", analysis: "TaskAnalysis", target: str) -> TemplateSpace:
        a = analyse(task, "full" if tpu_target(target) else "cpu")
        assert not isinstance(a, str)
        if tpu_target(target):
            from maxkernel.targets.specs import load_tpu_specs

            spec = load_tpu_specs()[target.removeprefix("tpu-")]
            small = analyse(task, "cpu")
            assert not isinstance(small, str)
            floors = check_floors(task, a, small)
            fits = [(bm, bk, bn) for bm in TPU_BLOCKS_M for bk in TPU_BLOCKS_KN for bn in TPU_BLOCKS_KN
                    if a.m % bm == 0 and a.k % bk == 0 and a.n % bn == 0 and vmem_bytes(a, bm, bk, bn) <= TPU_VMEM_BUDGET]
            # Priced = checked: tiles whose smallest twin is too big to check would be refused.
            checkable = [f for f in fits if _checkable(check_footprint(a, floors, *f))]
            if not checkable:
                return TemplateSpace(defaults={"block_m": 0, "block_k": 0, "block_n": 0},
                                     space={"block_m": [], "block_k": [], "block_n": []})
            best = min(checkable, key=lambda f: pipeline_s(spec, a, *f))
            fits = checkable
            return TemplateSpace(defaults=dict(zip(("block_m", "block_k", "block_n"), best)),
                                 space={"block_m": sorted({f[0] for f in fits}), "block_k": sorted({f[1] for f in fits}),
                                        "block_n": sorted({f[2] for f in fits})})
        # CPU (interpret mode): few, large steps.
        few = {name: sorted(d for d in divisors(extent) if extent // d <= 4)
               for name, extent in (("block_m", a.m), ("block_k", a.k), ("block_n", a.n))}
        return TemplateSpace(defaults={"block_m": max(a.m // 4, few["block_m"][0]), "block_k": a.k, "block_n": a.n},
                             space=few)

    def render(self, task: "Task", params: dict[str, Any], sizes: tuple[str, ...]) -> str:
        a = shape_for_sizes(task, sizes)
        return render_gmm(task, a, int(params["block_m"]), int(params["block_k"]), int(params["block_n"]))


def _checkable(footprint: tuple[float, int]) -> bool:
    flops, steps = footprint
    return flops <= CHECK_FLOPS and steps <= CHECK_GRID_STEPS


def shape_for_sizes(task: "Task", sizes: tuple[str, ...]) -> GroupedShape:
    """The grouped shape at the first size, refused (EmitError) unless every size has one with the same
    argument roles and dtypes (one source serves them all)."""
    shapes = [analyse(task, size) for size in sizes]
    failed = next((s for s in shapes if isinstance(s, str)), None)
    if failed is not None:
        raise EmitError(failed)
    found = [s for s in shapes if not isinstance(s, str)]
    if len({(s.dtype, s.out_dtype, tuple(s.names.items())) for s in found}) != 1:
        raise EmitError("argument roles or dtypes that change with size")
    return found[0]


def render_gmm(task: "Task", a: GroupedShape, bm: int, bk: int, bn: int) -> str:
    lhs, rhs, sizes = a.names["lhs"], a.names["rhs"], a.names["group_sizes"]
    args = ", ".join(arg_names(task)[:3])
    f32 = a.dtype == np.float32
    precision = ", precision=jax.lax.Precision.HIGHEST" if f32 else ""
    sublanes = sublane_rows(a.dtype, a.out_dtype)
    # Tiles tuned for a TPU are multiples of its VMEM tiling, and so is any other block the rule picks; a CPU
    # tuning's tiles need not be, and then any block is legal.
    row_align = sublanes if bm % sublanes == 0 else 1
    row_why = (f"row tiles are whole {sublanes}-row sublane tiles of the TPU ({a.dtype.name})" if row_align > 1
               else "BLOCK_M is no multiple of the TPU's sublane tile (a CPU tuning): any row tile")
    depth_align = LANES if bk % LANES == 0 else 1
    depth_why = (f"depth blocks are whole {LANES}-lane tiles of the TPU" if depth_align > 1
                 else "BLOCK_K is no multiple of the TPU's lane tile (a CPU tuning): any depth block")
    lines = [
        f'"""{task.id}: grouped matmul, megablox style, over (row tile, group) visits.\n',
        "Grid (column tile, visit, depth tile): each visit multiplies one row tile by its group's weight tile",
        "into an f32 VMEM accumulator and, after the last depth tile, writes the rows its group owns. The visits",
        "(every row tile and group that share a row, in order) come from the group sizes at run time, by scalar",
        "prefetch; a tile on a group boundary is visited once per group, consecutively, so its output block",
        "stays in VMEM until all its rows are written. Generated by MaxKernel's rules brain.",
        '"""',
        "",
        "import functools",
        "",
        "import jax",
        "import jax.numpy as jnp",
        "from jax.experimental import pallas as pl",
        "from jax.experimental.pallas import tpu as pltpu",
        "",
        f"BLOCK_M = {bm}  # rows per tile",
        f"BLOCK_K = {bk}  # depth per step",
        f"BLOCK_N = {bn}  # output columns per tile",
        f"ROW_ALIGN = {row_align}  # {row_why}",
        f"DEPTH_ALIGN = {depth_align}  # {depth_why}",
        "",
        "",
        BLOCK_FOR_SOURCE,
        "",
        "",
        "def _row_blocks(rows):",
        '    """The row tile and the rows the grid covers: the block rule\'s divisor of ``rows`` where it has one of at',
        "    least half BLOCK_M (at most twice the tuned steps), else BLOCK_M tiles (one tile of the rows rounded up to",
        "    ROW_ALIGN when they are fewer) over the rows padded to a whole tile. Group boundaries fall anywhere, so",
        '    padded rows are just rows no group owns: no visit writes them, and they are cut from the output."""',
        "    legal = range(BLOCK_M // ROW_ALIGN * ROW_ALIGN, BLOCK_M // 2 - 1, -ROW_ALIGN)",
        "    if any(rows % block == 0 for block in legal) or (rows <= BLOCK_M and rows % ROW_ALIGN == 0):",
        '        return block_for(rows, BLOCK_M, ROW_ALIGN, BLOCK_M // 2, "rows"), rows',
        "    block_m = min(BLOCK_M, -(-rows // ROW_ALIGN) * ROW_ALIGN)",
        "    return block_m, -(-rows // block_m) * block_m",
        "",
        "",
        "def _group_metadata(group_sizes, rows, block_m):",
        '    """Per visit: its group and row tile (every pair sharing a row, in order, at most tiles + groups - 1),',
        "    each group's first and last row + 1, and how many visits are real (the grid's visit extent; the rest",
        '    of the arrays repeat the last real visit)."""',
        "    groups = group_sizes.shape[0]",
        "    ends = jnp.cumsum(group_sizes).astype(jnp.int32)",
        "    starts = ends - group_sizes",
        "    first = starts // block_m",
        "    last = jnp.where(group_sizes > 0, (ends - 1) // block_m, first - 1)",
        "    count = last - first + 1  # tiles each group touches (0 for an empty group)",
        "    offset = jnp.cumsum(count) - count",
        "    total = jnp.sum(count)",
        "    visit = jnp.minimum(jnp.arange(rows // block_m + groups - 1), total - 1)",
        '    group_of = jnp.clip(jnp.searchsorted(offset + count, visit, side="right"), 0, groups - 1)',
        "    tile_of = first[group_of] + visit - offset[group_of]",
        "    return (group_of.astype(jnp.int32), tile_of.astype(jnp.int32), starts, ends,",
        "            total.astype(jnp.int32))",
        "",
        "",
        "def _gmm_kernel(group_ref, tile_ref, starts_ref, ends_ref, lhs_ref, rhs_ref, o_ref, acc_ref, *, block_m):",
        "    t, kk = pl.program_id(1), pl.program_id(2)",
        "",
        "    @pl.when(kk == 0)",
        "    def _init():",
        "        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)",
        "",
        "    acc_ref[...] += jax.lax.dot_general(lhs_ref[...], rhs_ref[...], (((1,), (0,)), ((), ())),",
        f"                                        preferred_element_type=jnp.float32{precision})",
        "",
        "    @pl.when(kk == pl.num_programs(2) - 1)",
        "    def _store():  # only the rows this visit's group owns; the tile's other groups write theirs",
        "        g = group_ref[t]",
        "        rows = tile_ref[t] * block_m + jax.lax.broadcasted_iota(jnp.int32, (block_m, 1), 0)",
        "        mine = (rows >= starts_ref[g]) & (rows < ends_ref[g])",
        "        o_ref[...] = jnp.where(mine, acc_ref[...].astype(o_ref.dtype), o_ref[...])",
        "",
        "",
        f"def kernel({args}):",
        f"    rows, depth = {lhs}.shape",
        f"    cols = {rhs}.shape[2]",
        "    # Rows in whole tiles (padded where no legal tile divides them) and depth tiled exactly (refused where",
        "    # no legal block divides it); the last column tile may be partial (Pallas drops its extra columns).",
        "    block_m, tiled_rows = _row_blocks(rows)",
        '    block_k, block_n = block_for(depth, BLOCK_K, DEPTH_ALIGN, 1, "depth"), min(BLOCK_N, cols)',
        f"    lhs_tiles = {lhs} if tiled_rows == rows else jnp.pad({lhs}, ((0, tiled_rows - rows), (0, 0)))",
        f"    group_of, tile_of, starts, ends, total = _group_metadata({sizes}, tiled_rows, block_m)",
        "    grid_spec = pltpu.PrefetchScalarGridSpec(",
        "        num_scalar_prefetch=4,",
        "        grid=(pl.cdiv(cols, block_n), total, depth // block_k),  # only the real visits",
        "        in_specs=[",
        "            pl.BlockSpec((block_m, block_k), lambda j, t, kk, grp, tile, st, en: (tile[t], kk)),",
        "            pl.BlockSpec((None, block_k, block_n), lambda j, t, kk, grp, tile, st, en: (grp[t], kk, j)),",
        "        ],",
        "        out_specs=pl.BlockSpec((block_m, block_n), lambda j, t, kk, grp, tile, st, en: (tile[t], j)),",
        "        scratch_shapes=[pltpu.VMEM((block_m, block_n), jnp.float32)],",
        "    )",
        "    out = pl.pallas_call(",
        "        functools.partial(_gmm_kernel, block_m=block_m),",
        "        grid_spec=grid_spec,",
        f"        out_shape=jax.ShapeDtypeStruct((tiled_rows, cols), {dtype_expr(a.out_dtype)}),",
        '        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary", "arbitrary")),',
        f"    )(group_of, tile_of, starts, ends, lhs_tiles, {rhs})",
        "    return out if tiled_rows == rows else out[:rows]",
    ]
    return "\n".join(lines) + "\n"


GROUPED_MATMUL = GroupedMatmulTemplate()
