"""Grouped matmuls and routed experts computed only where rows and weights meet.

A grouped matmul (``ragged_dot``, Megablox GMM) gives each contiguous run of rows its own weight
matrix. Written densely, as references tend to be, it multiplies every row by every group's weights
and keeps one result in ``num_groups``. A mixture of experts written densely runs every expert on every
token and weights most results by zero. Both become: sort (or keep) rows by group, walk each group's
rows in tiles, multiply a tile only by its own group's weights. The work drops by about the number of
groups (the top-k share of experts), paid for with one masked tile per group boundary.

Two forms of the grouped product, chosen by tuning:
- ``loop``: per group, a ``while_loop`` over that group's row tiles (no copies of weights);
- ``pairs``: every (tile, group) pair that meets, gathered and multiplied in one batched matmul
  (at most ``tiles + groups - 1`` pairs, known statically), then summed back per tile.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from maxkernel.analysis.moe import moe_roles
from maxkernel.analysis.program import Program, Var, arg_names, static_args, trace_program
from maxkernel.rewrites.emit import dtype_expr
from maxkernel.rewrites.structural import candidate_header
from maxkernel.templates.base import TemplateSpace

if TYPE_CHECKING:
    from jaxbench.task import Task
    from maxkernel.analysis import TaskAnalysis

TILES = (16, 32, 64, 128)

GROUP_TILES = '''
def _group_tiles(group_sizes, rows, tile):
    """Every (row tile, group) pair that shares a row: at most tiles + groups - 1 of them."""
    groups = group_sizes.shape[0]
    tiles = -(-rows // tile)
    ends = jnp.cumsum(group_sizes)
    starts = ends - group_sizes
    first = starts // tile
    last = jnp.where(group_sizes > 0, (ends - 1) // tile, first - 1)
    count = last - first + 1  # tiles each group touches (0 for an empty group)
    offset = jnp.cumsum(count) - count
    pair = jnp.arange(tiles + groups - 1)
    group_of = jnp.clip(jnp.searchsorted(offset + count, pair, side="right"), 0, groups - 1)
    tile_of = jnp.clip(first[group_of] + pair - offset[group_of], 0, tiles - 1)
    row = tile_of[:, None] * tile + jnp.arange(tile)[None, :]
    keep = (pair < jnp.sum(count))[:, None] & (row >= starts[group_of][:, None]) & (row < ends[group_of][:, None])
    return tiles, group_of, tile_of, keep
'''

PAIRS = '''
def _grouped_matmul(lhs, rhs, group_sizes, tile):
    """lhs rows [start_g, end_g) times rhs[g], one batched matmul over the (tile, group) pairs."""
    rows, depth = lhs.shape
    tiles, group_of, tile_of, keep = _group_tiles(group_sizes, rows, tile)
    lhs_tiles = jnp.pad(lhs, ((0, tiles * tile - rows), (0, 0))).reshape(tiles, tile, depth)
    part = jnp.einsum("ptk,pkn->ptn", lhs_tiles[tile_of], rhs[group_of], preferred_element_type=jnp.float32)
    part = jnp.where(keep[..., None], part, 0.0)
    out = jnp.zeros((tiles, tile, rhs.shape[2]), jnp.float32).at[tile_of].add(part)
    return out.reshape(tiles * tile, rhs.shape[2])[:rows]
'''

LOOP = '''
def _grouped_matmul(lhs, rhs, group_sizes, tile):
    """lhs rows [start_g, end_g) times rhs[g], walking each group's rows a tile at a time."""
    rows = lhs.shape[0]
    ends = jnp.cumsum(group_sizes)
    starts = ends - group_sizes
    padded = jnp.pad(lhs, ((0, tile), (0, 0)))
    out = jnp.zeros((rows + tile, rhs.shape[2]), jnp.float32)
    for g in range(rhs.shape[0]):
        def step(state, g=g):
            r, out = state
            part = jnp.dot(jax.lax.dynamic_slice_in_dim(padded, r, tile), rhs[g], preferred_element_type=jnp.float32)
            mine = (r + jnp.arange(tile) < ends[g])[:, None]
            old = jax.lax.dynamic_slice_in_dim(out, r, tile)
            return r + tile, jax.lax.dynamic_update_slice_in_dim(out, jnp.where(mine, part, old), r, 0)
        _, out = jax.lax.while_loop(lambda s, g=g: s[0] < ends[g], step, (starts[g], out))
    return out[:rows]
'''


@dataclass
class GroupedRoles:
    lhs: str
    rhs: str
    group_sizes: str
    out_dtype: Any


def _is_float(v: Var) -> bool:
    return np.issubdtype(np.dtype(v.dtype), np.floating) or np.dtype(v.dtype).name == "bfloat16"


def match_grouped(program: Program) -> GroupedRoles | str:
    ints = [v for v in program.inputs if len(v.shape) == 1 and v.integer]
    mats = [v for v in program.inputs if len(v.shape) == 2 and _is_float(v)]
    stacks = [v for v in program.inputs if len(v.shape) == 3 and _is_float(v)]
    if len(program.inputs) != 3 or len(ints) != 1 or len(mats) != 1 or len(stacks) != 1:
        return "inputs are not (rows [m, k], group sizes [g], weights [g, k, n])"
    sizes, lhs, rhs = ints[0], mats[0], stacks[0]
    if rhs.shape[0] != sizes.shape[0] or rhs.shape[1] != lhs.shape[1]:
        return "weights are not one [k, n] matrix per group"
    if len(program.outputs) != 1 or tuple(program.outputs[0].shape) != (lhs.shape[0], rhs.shape[2]):
        return "output is not [m, n]"
    prims = program.primitives()
    dots = prims.count("dot_general")
    if "ragged_dot_general" not in prims and not ("cumsum" in prims and "select_n" in prims and dots >= rhs.shape[0]):
        return "not a grouped matmul (no ragged_dot, nor a per-group dot selected by row)"
    return GroupedRoles(lhs.name, rhs.name, sizes.name, program.outputs[0].dtype)


def _widen_options(target: str) -> list[bool]:
    """Widening bf16 operands to f32 pays on a CPU only (see ``maxkernel.rewrites.widen``)."""
    return [False, True] if target == "cpu" else [False]


class GroupedMatmulRewrite:
    name = "grouped_matmul"
    description = "grouped matmul on (row tile, group) pairs instead of every group on every row"

    def applies(self, task: "Task", analysis: "TaskAnalysis") -> str | None:
        found = match_grouped(trace_program(task, "cpu").dce())
        return found if isinstance(found, str) else None

    def space(self, task: "Task", analysis: "TaskAnalysis", target: str) -> TemplateSpace:
        program = trace_program(task, "cpu").dce()
        rows = next(v.shape[0] for v in program.inputs if len(v.shape) == 2)
        tiles = [t for t in TILES if t <= rows] or [rows]
        return TemplateSpace(defaults={"form": "pairs", "tile": min(64, max(tiles)), "widen": False},
                             space={"form": ["pairs", "loop"], "tile": tiles, "widen": _widen_options(target)})

    def render(self, task: "Task", params: dict[str, Any], sizes: tuple[str, ...]) -> str:
        program = trace_program(task, "cpu").dce()
        roles = match_grouped(program)
        if isinstance(roles, str):
            raise ValueError(roles)
        names = arg_names(task)
        helpers = (GROUP_TILES + PAIRS) if params["form"] == "pairs" else LOOP
        doc = (f"{task.id}: {self.description}.\n\nform={params['form']}, tile={params['tile']} rows, "
               f"widen={bool(params.get('widen', False))}; "
               "f32 accumulation, then the reference's output dtype.")
        widen = (f"    {roles.lhs} = {roles.lhs}.astype(jnp.float32)  # f32 products of bf16 values are exact\n"
                 f"    {roles.rhs} = {roles.rhs}.astype(jnp.float32)\n") if params.get("widen") else ""
        return (candidate_header(doc) + "\n" + helpers + "\n\n"
                f"def kernel({', '.join(names)}, **static):\n" + widen +
                f"    out = _grouped_matmul({roles.lhs}, {roles.rhs}, {roles.group_sizes}, {int(params['tile'])})\n"
                f"    return out.astype({dtype_expr(roles.out_dtype)})\n")


PAIRS_BY_EXPERT = '''
def _pairs_by_expert(top_idx, experts):
    """The (token, choice) pairs sorted by expert: expert e owns sorted rows [starts[e], ends[e]); the token
    each sorted row reads and, for each pair in [token, choice] order, its sorted row."""
    expert_of = top_idx.reshape(-1)
    rows, top_k = expert_of.shape[0], top_idx.shape[1]
    order = jnp.argsort(expert_of, stable=True)
    sizes = jnp.bincount(expert_of, length=experts)
    ends = jnp.cumsum(sizes)
    row_of_pair = jnp.zeros((rows,), jnp.int32).at[order].set(jnp.arange(rows, dtype=jnp.int32))
    return order // top_k, sizes, ends - sizes, ends, row_of_pair


def _combine(y, row_of_pair, weights):
    """Each token's chosen experts' outputs summed with their weights, in f32."""
    picked = y[row_of_pair].reshape(weights.shape + (y.shape[-1],))
    return jnp.sum(weights.astype(jnp.float32)[..., None] * picked, axis=1)
'''

EXPERTS_LOOP = '''
def _routed_experts(tokens, w_gate, w_up, w_down, top_idx, weights, tile, wide, expert_dtype):
    """Each (token, choice) pair through its own expert's SwiGLU only, each expert walking its sorted rows a
    tile at a time (gate, up and down fused per tile); the outputs summed per token with their weights."""
    hidden = tokens.shape[1]
    token_of_row, _, starts, ends, row_of_pair = _pairs_by_expert(top_idx, w_gate.shape[0])
    rows = token_of_row.shape[0]
    compute = jnp.float32 if wide else tokens.dtype  # f32 products of bf16 values are exact
    sorted_x = jnp.pad(tokens[token_of_row], ((0, tile), (0, 0))).astype(compute)
    y = jnp.zeros((rows + tile, hidden), jnp.float32)
    for e in range(w_gate.shape[0]):
        wg, wu, wd = w_gate[e].astype(compute), w_up[e].astype(compute), w_down[e].astype(compute)

        def step(state, e=e, wg=wg, wu=wu, wd=wd):
            r, y = state
            xt = jax.lax.dynamic_slice_in_dim(sorted_x, r, tile)
            gate = jnp.dot(xt, wg, preferred_element_type=jnp.float32)
            up = jnp.dot(xt, wu, preferred_element_type=jnp.float32)
            h = (jax.nn.silu(gate) * up).astype(w_down.dtype).astype(compute)
            part = jnp.dot(h, wd, preferred_element_type=jnp.float32).astype(expert_dtype).astype(jnp.float32)
            mine = (r + jnp.arange(tile) < ends[e])[:, None]
            old = jax.lax.dynamic_slice_in_dim(y, r, tile)
            return r + tile, jax.lax.dynamic_update_slice_in_dim(y, jnp.where(mine, part, old), r, 0)
        _, y = jax.lax.while_loop(lambda s, e=e: s[0] < ends[e], step, (starts[e], y))
    return _combine(y[:rows], row_of_pair, weights)
'''

EXPERTS_PAIRS = '''
def _routed_experts(tokens, w_gate, w_up, w_down, top_idx, weights, tile, wide, expert_dtype):
    """Each (token, choice) pair through its own expert's SwiGLU only: gate, up and down each one grouped
    matmul over the (row tile, expert) pairs of the rows sorted by expert; the outputs summed per token."""
    token_of_row, sizes, _, _, row_of_pair = _pairs_by_expert(top_idx, w_gate.shape[0])
    compute = jnp.float32 if wide else tokens.dtype  # f32 products of bf16 values are exact
    sorted_x = tokens[token_of_row].astype(compute)
    gate = _grouped_matmul(sorted_x, w_gate.astype(compute), sizes, tile)
    up = _grouped_matmul(sorted_x, w_up.astype(compute), sizes, tile)
    h = (jax.nn.silu(gate) * up).astype(w_down.dtype).astype(compute)
    y = _grouped_matmul(h, w_down.astype(compute), sizes, tile).astype(expert_dtype).astype(jnp.float32)
    return _combine(y, row_of_pair, weights)
'''


def experts_source(form: str) -> str:
    """The routed SwiGLU experts helper (``_routed_experts``) in one of its two forms, with what it calls."""
    if form == "pairs":
        return PAIRS_BY_EXPERT + GROUP_TILES + PAIRS + EXPERTS_PAIRS
    return PAIRS_BY_EXPERT + EXPERTS_LOOP


def experts_constants(params: dict[str, Any]) -> str:
    return (f"TILE = {int(params['tile'])}  # sorted (token, choice) rows per expert step\n"
            f"WIDEN = {bool(params.get('widen', False))}  # bf16 operands widened to f32 before the matmuls\n")


def experts_space(rows: int, target: str) -> TemplateSpace:
    """Tiles up to the (token, choice) rows; both forms; widening where it pays."""
    tiles = [t for t in TILES if t <= rows] or [rows]
    return TemplateSpace(defaults={"form": "loop", "tile": 32 if 32 in tiles else tiles[-1], "widen": False},
                         space={"form": ["loop", "pairs"], "tile": tiles, "widen": _widen_options(target)})


TASK_ROUTING = '''
def _route(tokens, w_router, top_k):
    """Top-k of a softmax over the experts in f32 (the kept probabilities {renorm})."""
    probs = jax.nn.softmax(jnp.dot(tokens, w_router, preferred_element_type=jnp.float32), axis=-1)
    top_p, top_idx = jax.lax.top_k(probs, top_k)
    return {weights}, top_idx
'''


@dataclass
class ExpertRoles:
    names: list[str]  # x, router, gate, up, down (in the reference's argument order of roles)
    top_k: int
    renormalize: bool
    out_dtype: Any


def match_experts(program: Program, static: dict[str, Any]) -> ExpertRoles | str:
    if len(program.inputs) != 5:
        return "inputs are not (x, router, gate, up, down)"
    x, router, gate, up, down = program.inputs
    hidden = x.shape[-1]
    if len(router.shape) != 2 or router.shape[0] != hidden:
        return "no [hidden, experts] router after x"
    experts = router.shape[1]
    if not (gate.shape == up.shape and len(gate.shape) == 3 and gate.shape[:2] == (experts, hidden)
            and down.shape == (experts, gate.shape[2], hidden)):
        return "weights are not gate/up [E, hidden, inter] and down [E, inter, hidden]"
    top = [n for n in program.nodes if n.prim == "top_k"]
    if len(top) != 1 or "logistic" not in program.primitives():
        return "not top-k routed SwiGLU experts"
    top_k = int(top[0].params.get("k", 0))
    if top_k not in static.values() or top_k <= 0:
        return "top-k is not a static argument"
    renormalize = any(n.prim == "div" and n.ins[0] is top[0].outs[0] for n in program.nodes)
    if len(program.outputs) != 1 or tuple(program.outputs[0].shape) != tuple(x.shape):
        return "output is not shaped like x"
    return ExpertRoles([v.name for v in program.inputs], top_k, renormalize, program.outputs[0].dtype)


class RoutedExpertsRewrite:
    name = "routed_experts"
    description = "mixture of experts: each expert runs only on its routed tokens, not on all of them"

    def applies(self, task: "Task", analysis: "TaskAnalysis") -> str | None:
        found = match_experts(trace_program(task, "cpu").dce(), static_args(task, "cpu"))
        if not isinstance(found, str):
            return None
        from maxkernel.rewrites.expert_region import expert_region

        region = expert_region(task, ("cpu", "full"))
        return None if not isinstance(region, str) else f"{found}; as an expert region: {region}"

    def space(self, task: "Task", analysis: "TaskAnalysis", target: str) -> TemplateSpace:
        roles = moe_roles(task, "cpu")
        if isinstance(roles, str):
            raise ValueError(roles)
        return experts_space(roles.tokens * roles.k, target)

    def render(self, task: "Task", params: dict[str, Any], sizes: tuple[str, ...]) -> str:
        roles = match_experts(trace_program(task, "cpu").dce(), static_args(task, "cpu"))
        if isinstance(roles, str):
            from maxkernel.rewrites.expert_region import render_region

            return render_region(task, params, sizes, self.description)
        x, router, gate, up, down = roles.names
        routing = TASK_ROUTING.replace("{renorm}", "renormalized to sum to one" if roles.renormalize else "as they are")
        weights = "top_p / jnp.sum(top_p, axis=-1, keepdims=True)" if roles.renormalize else "top_p"
        doc = (f"{task.id}: {self.description}.\n\nform={params.get('form', 'loop')}, tile={params['tile']} "
               f"token copies per expert step, widen={bool(params.get('widen', False))}.")
        names = arg_names(task)
        return (candidate_header(doc) + "\n" + experts_constants(params) + experts_source(params.get("form", "loop"))
                + routing.replace("{weights}", weights) + "\n\n"
                f"def kernel({', '.join(names)}, **static):\n"
                f"    tokens = {x}.reshape(-1, {x}.shape[-1])\n"
                f"    weights, top_idx = _route(tokens, {router}, {roles.top_k})\n"
                f"    out = _routed_experts(tokens, {gate}, {up}, {down}, top_idx, weights, TILE, WIDEN, jnp.float32)\n"
                f"    return out.astype({dtype_expr(roles.out_dtype)}).reshape({x}.shape)\n")


GROUPED_MATMUL = GroupedMatmulRewrite()
ROUTED_EXPERTS = RoutedExpertsRewrite()
