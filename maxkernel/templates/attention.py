"""Flash attention: online softmax over key blocks, causal block skipping, GQA head mapping.

Each grid step (batch, query head, query block, key block) scores one query block against one key block,
keeps the running row max and row sum in VMEM scratch, and rescales the f32 accumulator, so the
[seq, seq] score matrix never exists. Under a causal mask, key blocks entirely above the diagonal are
skipped (no compute, and their index map repeats the last needed block, so no DMA either). Query head h
reads key/value head h // group. Scale and causality are read from the reference's jaxpr.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from maxkernel.analysis.program import Const, Program, Var, arg_names, trace_program
from maxkernel.rewrites.emit import EmitError, dtype_expr, scalar_text
from maxkernel.templates.base import TPU_VMEM_BUDGET, TemplateSpace, divisors, pick_block, tpu_target

if TYPE_CHECKING:
    from jaxbench.task import Task
    from maxkernel.analysis import TaskAnalysis

HEADER = ("import jax\nimport jax.numpy as jnp\nfrom jax.experimental import pallas as pl\n"
          "from jax.experimental.pallas import tpu as pltpu\n")
OTHER_MASKS = {"and", "or", "gather", "dynamic_slice", "scan", "while", "cumsum", "select_and_scatter_add"}


@dataclass
class AttentionShape:
    batch: int
    q_heads: int
    kv_heads: int
    seq: int
    head_dim: int
    scale: float
    causal: bool
    out_dtype: Any


def match(program: Program) -> AttentionShape | str:
    if len(program.inputs) != 3 or any(len(v.shape) != 4 for v in program.inputs):
        return "inputs are not q, k, v of rank 4"
    q, k, v = program.inputs
    if k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[2:] != k.shape[2:] or q.shape[1] % k.shape[1]:
        return "q, k, v shapes are not [batch, heads, seq, head_dim] with kv heads dividing q heads"
    prims = set(program.primitives())
    if prims & OTHER_MASKS:
        return f"masking beyond causal ({sorted(prims & OTHER_MASKS)[0]})"
    dots = [n for n in program.nodes if n.prim == "dot_general"]
    if len(dots) != 2 or "exp" not in prims or "reduce_max" not in prims:
        return "not a softmax(q k^T) v computation"
    outs = program.outputs
    if len(outs) != 1 or tuple(outs[0].shape) != tuple(q.shape):
        return "output is not shaped like q"
    users = program.users()
    scale = 1.0
    current = dots[0].out
    for _ in range(4):
        readers = users.get(current, [])
        if len(readers) != 1 or readers[0].prim not in ("div", "mul", "convert_element_type"):
            break
        node = readers[0]
        const = next((op for op in node.ins if isinstance(op, Const)), None)
        if const is not None and const.scalar() is not None:
            c = float(const.scalar())  # type: ignore[arg-type]
            scale = scale / c if node.prim == "div" else scale * c
        current = node.out
    producers = program.producers()

    def from_iota(op: Any, depth: int = 0) -> bool:
        p = producers.get(op) if isinstance(op, Var) else None
        if p is None or depth > 6:
            return False
        return p.prim == "iota" or any(from_iota(i, depth + 1) for i in p.ins)

    causal = any(n.prim in ("le", "ge", "lt", "gt") and all(from_iota(i) or isinstance(i, Const) for i in n.ins)
                 for n in program.nodes)
    b, hq, s, d = q.shape
    return AttentionShape(b, hq, k.shape[1], s, d, scale, causal, outs[0].dtype)


class FlashAttentionTemplate:
    name = "flash_attention"
    description = "flash attention with online softmax, causal block skipping and GQA head mapping"

    def applies(self, task: "Task", analysis: "TaskAnalysis") -> str | None:
        if "attention" not in analysis.patterns:
            return "no attention pattern"
        found = match(trace_program(task, "cpu").dce())
        return found if isinstance(found, str) else None

    def space(self, task: "Task", analysis: "TaskAnalysis", target: str) -> TemplateSpace:
        size = "full" if tpu_target(target) else "cpu"
        a = match(trace_program(task, size).dce())
        assert not isinstance(a, str)
        if tpu_target(target):
            bqs = [x for x in divisors(a.seq) if x % 8 == 0 and 128 <= x <= 1024]
            bks = [x for x in divisors(a.seq) if x % 128 == 0 and x <= 2048]
            fits = [(x, y) for x in bqs for y in bks if 4 * (2 * (x + 2 * y) * a.head_dim + x * a.head_dim + x * y * 2) <= TPU_VMEM_BUDGET]
            best = max(fits, key=lambda t: (t[0], t[1]), default=(bqs[0] if bqs else a.seq, bks[0] if bks else a.seq))
            return TemplateSpace(defaults={"block_q": best[0], "block_k": best[1]},
                                 space={"block_q": sorted({f[0] for f in fits}), "block_k": sorted({f[1] for f in fits})})
        opts = sorted({a.seq, a.seq // 2, a.seq // 4} - {0})
        return TemplateSpace(defaults={"block_q": a.seq, "block_k": a.seq // 2 if a.causal else a.seq},
                             space={"block_q": opts, "block_k": opts})

    def render(self, task: "Task", params: dict[str, Any], sizes: tuple[str, ...]) -> str:
        from maxkernel.templates.rowblock import _dispatch

        names = arg_names(task)[:3]
        parts = [f'"""{task.id}: {self.description}.\n\nblock_q={params["block_q"]}, block_k={params["block_k"]} '
                 "(clamped to divisors of the sequence at each size). Generated by MaxKernel's rules brain.\n\"\"\"\n", HEADER]
        dispatch = []
        for size in sizes:
            program = trace_program(task, size).dce()
            a = match(program)
            if isinstance(a, str):
                raise EmitError(a)
            bq = pick_block(a.seq, divisors(a.seq), int(params["block_q"]))
            bk = pick_block(a.seq, divisors(a.seq), int(params["block_k"]))
            parts.append(_render_size(a, size, bq, bk, names))
            dispatch.append((f"_attention_{size}", tuple(v.shape for v in program.inputs)))
        parts.append(_dispatch(dispatch, names))
        return "\n".join(parts)


def _render_size(a: AttentionShape, size: str, bq: int, bk: int, names: list[str]) -> str:
    group = a.q_heads // a.kv_heads
    d = a.head_dim
    mask = ["        rows = i * BQ + jax.lax.broadcasted_iota(jnp.int32, (BQ, BK), 0)",
            "        cols = j * BK + jax.lax.broadcasted_iota(jnp.int32, (BQ, BK), 1)",
            "        s = jnp.where(cols <= rows, s, -jnp.inf)"] if a.causal else []
    body = [
        f"def _flash_kernel_{size}(q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref):",
        f"    BQ, BK = {bq}, {bk}",
        "    i = pl.program_id(2)",
        "    j = pl.program_id(3)",
        "",
        "    @pl.when(j == 0)",
        "    def _init():",
        "        m_ref[...] = jnp.full(m_ref.shape, -jnp.inf, jnp.float32)",
        "        l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)",
        "        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)",
        "",
        "    def _step():",
        "        q = q_ref[...].astype(jnp.float32)",
        "        k = k_ref[...].astype(jnp.float32)",
        "        v = v_ref[...].astype(jnp.float32)",
        "        s = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), precision=jax.lax.Precision.HIGHEST,",
        f"                                preferred_element_type=jnp.float32) * {scalar_text(np.float32(a.scale))}",
        *mask,
        "        m_prev = m_ref[...]",
        "        m_new = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))",
        "        alpha = jnp.exp(m_prev - m_new)",
        "        p = jnp.exp(s - m_new)",
        "        l_ref[...] = alpha * l_ref[...] + jnp.sum(p, axis=1, keepdims=True)",
        "        acc_ref[...] = alpha * acc_ref[...] + jax.lax.dot_general(",
        "            p, v, (((1,), (0,)), ((), ())), precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32)",
        "        m_ref[...] = m_new",
        "",
    ]
    if a.causal:
        body += ["    # Causal block skipping: key blocks wholly above the diagonal do no work.",
                 "    pl.when(j * BK <= i * BQ + BQ - 1)(_step)"]
    else:
        body += ["    _step()"]
    body += [
        "",
        "    @pl.when(j == pl.num_programs(3) - 1)",
        "    def _finish():",
        "        o_ref[...] = (acc_ref[...] / l_ref[...]).astype(o_ref.dtype)",
        "",
    ]
    last_needed = f"jnp.minimum(j, (i * {bq} + {bq - 1}) // {bk})" if a.causal else "j"
    q_, k_, v_ = names
    body += [
        f"def _attention_{size}({q_}, {k_}, {v_}):",
        "    return pl.pallas_call(",
        f"        _flash_kernel_{size},",
        f"        out_shape=jax.ShapeDtypeStruct({(a.batch, a.q_heads, a.seq, d)}, {dtype_expr(np.dtype(a.out_dtype))}),",
        f"        grid=({a.batch}, {a.q_heads}, {a.seq // bq}, {a.seq // bk}),",
        "        in_specs=[",
        f"            pl.BlockSpec((None, None, {bq}, {d}), lambda b, h, i, j: (b, h, i, 0)),",
        f"            pl.BlockSpec((None, None, {bk}, {d}), lambda b, h, i, j: (b, h // {group}, {last_needed}, 0)),",
        f"            pl.BlockSpec((None, None, {bk}, {d}), lambda b, h, i, j: (b, h // {group}, {last_needed}, 0)),",
        "        ],",
        f"        out_specs=pl.BlockSpec((None, None, {bq}, {d}), lambda b, h, i, j: (b, h, i, 0)),",
        f"        scratch_shapes=[pltpu.VMEM(({bq}, 1), jnp.float32), pltpu.VMEM(({bq}, 1), jnp.float32),",
        f"                        pltpu.VMEM(({bq}, {d}), jnp.float32)],",
        f"    )({q_}, {k_}, {v_})",
    ]
    return "\n".join(body) + "\n"


FLASH_ATTENTION = FlashAttentionTemplate()
