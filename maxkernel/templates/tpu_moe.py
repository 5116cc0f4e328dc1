"""TPU MoE: a top-k routed mixture of SwiGLU experts, each token run through its chosen experts only.

What an expert writes for a Mixtral-style layer on a TPU (the megablox layout, with the SwiGLU fused):
- the router in XLA: softmax over experts in f32, the top_k kept and renormalized;
- the (token, choice) pairs sorted by expert, each expert's rows padded to whole row blocks, so that every
  row block belongs to one expert; the block -> expert table is scalar-prefetched and the weights' index
  maps read it, so a step DMAs the blocks of its own expert only. The grid is static: the padded rows
  are at most ``cdiv(pairs, BLOCK_M) + experts`` blocks, whatever the routing;
- per step the tpu_mlp chain: gate and up products of a row block with a block of hidden columns,
  ``silu(gate) * up`` rounded to bf16 in VMEM, its product with the down weight's rows accumulated into
  whole f32 output rows (the output block itself, resident across the hidden steps);
- the pairs' rows gathered back and summed with their router weights in f32, rounded once.
Two forms are read: a task of x, router and the three expert weights (the router matmul inside), and the
expert region of a model layer (``maxkernel extract``), which takes the router's f32 logits, the normed
tokens, the expert weights and the residual it adds the experts' sum to.
The template renders only what its router and experts compute, and says so only after comparing the
reference with that computation on the task's own inputs at the ``cpu`` size.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from maxkernel.analysis.moe import MoePlan, moe_roles, plan_sizes
from maxkernel.analysis.program import input_shapes, trace_program
from maxkernel.rewrites.emit import EmitError
from maxkernel.templates.base import FIT_SOURCE, TemplateSpace
from maxkernel.templates.tpu_gemm import HEADER, W_KN_DIMENSIONS, _mxu_source
from maxkernel.templates.tpu_mlp import Legal, chain_space, chain_vmem_bytes

if TYPE_CHECKING:
    from jaxbench.task import Task
    from maxkernel.analysis import TaskAnalysis

# Rows a step at most: each expert's rows are padded to whole blocks (experts x BLOCK_M / 2 wasted rows on
# average), and at 512 rows a step's MXU work already covers its weight DMA on v6e.
MOE_MAX_BLOCK_M = 512

ROUTING_SOURCE = '''def _route(tokens, w_router, top_k):
    """The router: softmax over the experts in f32, the top_k kept and renormalized to sum to one."""
    logits = jnp.dot(tokens, w_router, preferred_element_type=jnp.float32)
    top_p, top_idx = jax.lax.top_k(jax.nn.softmax(logits, axis=-1), top_k)
    return top_p / jnp.sum(top_p, axis=-1, keepdims=True), top_idx


def _route_logits(logits, top_k):
    """The router from its logits: the top_k kept, a softmax over them in f32 (the same weights as a softmax
    over every expert renormalized over the top_k)."""
    top_vals, top_idx = jax.lax.top_k(logits.astype(jnp.float32), top_k)
    return jax.nn.softmax(top_vals, axis=-1), top_idx


def _combine(weights, picked):
    """Each token's chosen experts' outputs [tokens, top_k, width], summed with their weights in f32."""
    return jnp.sum(weights[..., None] * picked, axis=1)
'''

LAYOUT_SOURCE = '''def _layout(top_idx, num_experts, block_m):
    """The (token, choice) pairs sorted by expert, each expert's rows padded to whole blocks: the padded row
    of every pair, the token every row reads (padding reads token 0), the expert of every block (the last
    expert past the blocks in use) and the number of blocks in use."""
    pairs = top_idx.reshape(-1)
    count = pairs.shape[0]
    order = jnp.argsort(pairs, stable=True)
    expert_of = pairs[order]
    sizes = jnp.sum(jax.nn.one_hot(pairs, num_experts, dtype=jnp.int32), axis=0)
    padded = (sizes + block_m - 1) // block_m * block_m
    ends = jnp.cumsum(padded)
    dest = (ends - padded)[expert_of] + jnp.arange(count, dtype=jnp.int32) - (jnp.cumsum(sizes) - sizes)[expert_of]
    blocks = pl.cdiv(count, block_m) + num_experts
    token_of_row = jnp.zeros((blocks * block_m,), jnp.int32).at[dest].set(order // top_idx.shape[1])
    row_of_pair = jnp.zeros((count,), jnp.int32).at[order].set(dest)
    starts = jnp.arange(blocks, dtype=jnp.int32) * block_m
    block_expert = jnp.minimum(jnp.searchsorted(ends, starts, side="right"), num_experts - 1)
    used = (ends[-1] // block_m).reshape((1,)).astype(jnp.int32)
    return row_of_pair, token_of_row, block_expert.astype(jnp.int32), used
'''

KERNEL_BODY = '''def _moe_kernel(expert_ref, used_ref, x_ref, w_gate_ref, w_up_ref, w_down_ref, o_ref):
    """One row block (one expert's tokens) by one block of hidden columns: gate and up products and the
    SwiGLU stay in VMEM, their product with the down weight's rows accumulates into the f32 output rows.
    Blocks past those in use hold no pair: they do nothing (their rows are never read)."""
    j = pl.program_id(1)

    @pl.when(pl.program_id(0) < used_ref[0])
    def _block():
        @pl.when(j == 0)
        def _init():
            o_ref[...] = jnp.zeros_like(o_ref)

        x = x_ref[...]
        hidden = (jax.nn.silu(_product(x, w_gate_ref[...])) * _product(x, w_up_ref[...])).astype(jnp.bfloat16)
        o_ref[...] += _product(hidden, w_down_ref[...])


def _x_rows(i, j, expert, used):
    """Row blocks past those in use read the last one in use again: no DMA."""
    return (jnp.minimum(i, used[0] - 1), 0)


def _weight_cols(i, j, expert, used):
    """The block's expert's hidden columns; past the blocks in use one fixed block: no DMA."""
    return (expert[i], 0, jnp.where(i < used[0], j, 0))


def _weight_rows(i, j, expert, used):
    return (expert[i], jnp.where(i < used[0], j, 0), 0)
'''


def _routed_reference(routing: dict[str, Any], p: MoePlan, args: dict[str, Any], top_k: int) -> Any:
    """What the kernel computes, written densely (every expert on every token, then each token's chosen
    ones picked): the computation the reference is compared with."""
    import jax
    import jax.numpy as jnp

    x, gate, up, down = args[p.x], args[p.gate], args[p.up], args[p.down]
    tokens = x.reshape((-1, x.shape[-1]))
    if p.from_logits:
        weights, top_idx = routing["_route_logits"](args[p.router], top_k)
    else:
        weights, top_idx = routing["_route"](tokens, args[p.router], top_k)
    g = jnp.einsum("th,ehi->eti", tokens, gate, preferred_element_type=jnp.float32)
    u = jnp.einsum("th,ehi->eti", tokens, up, preferred_element_type=jnp.float32)
    y = jnp.einsum("eti,eih->eth", (jax.nn.silu(g) * u).astype(jnp.bfloat16), down, preferred_element_type=jnp.float32)
    picked = y[top_idx, jnp.arange(tokens.shape[0])[:, None]]
    out = routing["_combine"](weights, picked).astype(x.dtype)
    if p.residual:
        residual = args[p.residual]
        return residual + out.reshape(residual.shape)
    return out.reshape(x.shape)


def computes_the_reference(task: "Task") -> bool:
    """The reference equals the routed SwiGLU experts on the task's inputs at the ``cpu`` size, within
    the task's tolerance."""
    import jax
    import jax.numpy as jnp

    routing: dict[str, Any] = {"jax": jax, "jnp": jnp}
    exec(compile(ROUTING_SOURCE, "routing", "exec"), routing)
    args, static = task.get_inputs(jax.random.key(0), "cpu")
    roles = moe_roles(task, "cpu")
    assert not isinstance(roles, str)
    top_k = static[roles.top_k] if roles.top_k else roles.k
    expected = np.asarray(jax.jit(lambda *a: task.reference(*a, **static))(*args), np.float32)
    got = np.asarray(jax.jit(lambda *a: _routed_reference(routing, roles, dict(zip(roles.names, a)), top_k))(*args),
                     np.float32)
    tol = task.spec.tolerance
    return expected.shape == got.shape and bool(np.allclose(got, expected, atol=tol.atol, rtol=tol.rtol))


def plan(task: "Task", sizes: tuple[str, ...]) -> MoePlan | str:
    found = plan_sizes(task, sizes)
    if isinstance(found, str):
        return found
    last = found[-1]
    logits = dict(zip(last.names, input_shapes(task, sizes[-1]))).get(last.router)
    if last.from_logits and (logits is None or logits.shape != (last.tokens, last.experts)
                             or np.dtype(logits.dtype) != np.dtype("float32")):
        return (f"the routing reads {', '.join(last.routing)}: this template routes from the router's f32 logits "
                "[tokens, experts] alone (a softmax over the top-k logits)")
    if "top_k" not in trace_program(task, "cpu").primitives():
        return "no top-k routing in the reference"
    if not found[-1].top_k and len({p.k for p in found}) != 1:
        return "a literal top-k that differs between sizes (no static argument gives it)"
    return found[-1]


def _rules(task: "Task") -> tuple[Legal, dict[str, Any], dict[str, list[Any]]]:
    p = plan(task, ("full",))
    assert not isinstance(p, str)

    def legal(bm: int, bh: int, cap: int) -> bool:
        # Rows are padded to whole blocks per expert, so a row block need not divide the tokens.
        return bm <= MOE_MAX_BLOCK_M and p.intermediate % bh == 0 and chain_vmem_bytes(
            p.hidden, p.hidden, 2, 2, p.hidden * 4, bm, bh, 1, accumulator=False) <= cap

    return legal, {}, {}


class TpuMoeTemplate:
    name = "tpu_moe"
    description = ("top-k routed SwiGLU experts: pairs sorted by expert into whole row blocks, the block's "
                   "expert scalar-prefetched, gate, up and down fused per block, the hidden kept in VMEM")

    def applies(self, task: "Task", analysis: "TaskAnalysis") -> str | None:
        found = plan(task, ("cpu", "full"))
        if isinstance(found, str):
            return found
        if not computes_the_reference(task):
            return "the reference is not softmax top-k routing over SwiGLU experts (compared at the cpu size)"
        return None

    def space(self, task: "Task", analysis: "TaskAnalysis", target: str) -> TemplateSpace:
        return chain_space(target, lambda: _rules(task))

    def render(self, task: "Task", params: dict[str, Any], sizes: tuple[str, ...]) -> str:
        p = plan(task, sizes)
        if isinstance(p, str):
            raise EmitError(p)
        doc = (f'"""{task.id}: {self.description}.\n\nGenerated by MaxKernel\'s rules brain: '
               f"{params['block_m']} rows by {params['block_h']} hidden columns a step.\n\"\"\"\n")
        constants = (f"BLOCK_M = {int(params['block_m'])}  # rows of one expert per step (its rows are padded to these)\n"
                     f"BLOCK_H = {int(params['block_h'])}  # hidden columns per step (innermost, accumulated)\n"
                     + ("" if p.top_k else f"TOP_K = {p.k}  # experts each token keeps (the reference's literal)\n"))
        return "\n".join([doc, HEADER, constants, FIT_SOURCE, "", _mxu_source(W_KN_DIMENSIONS, 1),
                          ROUTING_SOURCE, "", LAYOUT_SOURCE, "", KERNEL_BODY, "", _kernel_source(p)])


def _kernel_source(p: MoePlan) -> str:
    x, router, gate, up, down = p.x, p.router, p.gate, p.up, p.down
    top_k = f"static[{p.top_k!r}]" if p.top_k else "TOP_K"
    route = f"_route_logits({router}, top_k)" if p.from_logits else f"_route(tokens, {router}, top_k)"
    if p.residual:
        result = (f"out = _combine(weights, picked).astype({x}.dtype)\n"
                  f"    return {p.residual} + out.reshape({p.residual}.shape)")
    else:
        result = f"return _combine(weights, picked).astype({x}.dtype).reshape({x}.shape)"
    return f'''def kernel({", ".join(p.names)}, **static):
    top_k = {top_k}
    width = {x}.shape[-1]
    tokens = {x}.reshape((-1, width))
    num_experts, _, inter = {gate}.shape
    block_h = _fit(BLOCK_H, inter)
    weights, top_idx = {route}
    row_of_pair, token_of_row, block_expert, used = _layout(top_idx, num_experts, BLOCK_M)
    rows = tokens[token_of_row]
    # What one step holds (blocks double-buffered, the gate, up and hidden tiles): the limit is raised to
    # it, with headroom for Mosaic's own temporaries.
    planned = 2 * ((BLOCK_M * width + 2 * width * block_h + block_h * width) * 2 + BLOCK_M * width * 4) + 3 * BLOCK_M * block_h * 4
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=2,
        grid=(rows.shape[0] // BLOCK_M, inter // block_h),
        in_specs=[
            pl.BlockSpec((BLOCK_M, width), _x_rows),
            pl.BlockSpec((None, width, block_h), _weight_cols),
            pl.BlockSpec((None, width, block_h), _weight_cols),
            pl.BlockSpec((None, block_h, width), _weight_rows),
        ],
        out_specs=pl.BlockSpec((BLOCK_M, width), lambda i, j, expert, used: (i, 0)),
    )
    y = pl.pallas_call(
        _moe_kernel,
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct((rows.shape[0], width), jnp.float32),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary"),
                                             vmem_limit_bytes=max(32 << 20, planned + (planned >> 2))),
    )(block_expert, used, rows, {gate}, {up}, {down})
    picked = y[row_of_pair].reshape(top_idx.shape + (width,))
    {result}
'''


TPU_MOE = TpuMoeTemplate()
