"""Flash attention for NVIDIA GPUs in Pallas: one program instance per (batch, head, query block) holds its
query block and streams the head's keys and values block by block with an online softmax, stopping at the
diagonal when the mask is causal (the key blocks above it are never loaded nor multiplied). Dots take the
inputs' own dtype (bf16 on the tensor cores) and accumulate in f32.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from maxkernel.templates.attention import AttentionShape, analyse
from maxkernel.templates.base import TemplateSpace
from maxkernel.templates.gpu_base import (
    GPU_BLOCKS,
    GPU_STAGES,
    GPU_WARPS,
    TRITON_SMEM_PLAN,
    backend_import,
    compiler_params_text,
    gpu_target,
    power_of_two,
)

if TYPE_CHECKING:
    from jaxbench.task import Task
    from maxkernel.analysis import TaskAnalysis

def _mask_kind(a: AttentionShape) -> str | None:
    if a.mask.all():
        return "none"
    if np.array_equal(a.mask, np.tril(np.ones_like(a.mask, dtype=bool))):
        return "causal"
    return None


def _shape(task: "Task", size: str) -> AttentionShape | str:
    from jaxbench.task_check import full_shapes

    a = analyse(task, size)
    if isinstance(a, str):
        return a
    if a.bias is not None:
        return "relative-position bias is not in the GPU template"
    if a.tail is not None:
        return "what follows the attention (an elementwise tail) is not in the GPU template"
    if _mask_kind(a) is None:
        return "only causal or unmasked attention is in the GPU template"
    # Blocks are powers of two (Triton) that divide the sequence: _fit keeps one when the sequence is a
    # power of two or a multiple of 16 at least as long as the largest block.
    fits = power_of_two(a.seq_q) or (a.seq_q % 16 == 0 and a.seq_q >= max(GPU_BLOCKS))
    if a.seq_q != a.seq_k or not power_of_two(a.head_dim) or not fits:
        return ("the GPU template needs equal sequence lengths (a power of two, or a multiple of 16 of at least "
                f"{max(GPU_BLOCKS)}) and a power-of-two head size")
    args, static, _ = full_shapes(task, size)
    if static or [tuple(x.shape) for x in args] != [
            (a.batch, a.q_heads, a.seq_q, a.head_dim), *[(a.batch, a.kv_heads, a.seq_k, a.head_dim)] * 2]:
        return "the GPU template takes (q, k, v) laid out [batch, heads, seq, head_dim]"
    return a


def smem_bytes(a: AttentionShape, block_q: int, block_k: int, stages: int) -> int:
    """Shared memory of one instance: the query block once, key and value blocks ``stages`` deep."""
    item = np.dtype(a.in_dtype).itemsize
    return block_q * a.head_dim * item + 2 * stages * block_k * a.head_dim * item


class GpuFlashAttentionTemplate:
    name = "gpu_flash_attention"
    description = ("flash attention for GPUs: a program per (batch, head, query block), online softmax over "
                   "key blocks up to the diagonal, bf16 tensor-core dots with f32 statistics")

    def applies(self, task: "Task", analysis: "TaskAnalysis") -> str | None:
        if "attention" not in analysis.patterns:
            return "no attention pattern"
        found = _shape(task, "cpu")
        return found if isinstance(found, str) else None

    def space(self, task: "Task", analysis: "TaskAnalysis", target: str) -> TemplateSpace:
        a = _shape(task, "full" if gpu_target(target) else "cpu")
        assert not isinstance(a, str)
        blocks = [b for b in GPU_BLOCKS if b <= a.seq_q and b >= 16]
        fits = [(bq, bk, s) for bq in blocks for bk in blocks for s in GPU_STAGES
                if smem_bytes(a, bq, bk, s) <= TRITON_SMEM_PLAN]
        space = {"block_q": sorted({f[0] for f in fits}), "block_k": sorted({f[1] for f in fits}),
                 "num_warps": list(GPU_WARPS), "num_stages": sorted({f[2] for f in fits}), "backend": ["triton"]}
        # Default: 128-row query blocks as in Triton's fused-attention tutorial, and the largest key block
        # whose pipelined tiles fit (fewer loop trips: also what keeps the interpreted check quick).
        block_q = min(128, a.seq_q)
        stages = 2 if a.head_dim > 64 else 3
        block_k = max((bk for bq, bk, s in fits if bq == block_q and s == stages and bk <= 128), default=min(64, a.seq_k))
        defaults = {"block_q": block_q, "block_k": block_k, "num_warps": 8 if a.head_dim > 64 else 4,
                    "num_stages": stages, "backend": "triton"}
        return TemplateSpace(defaults=defaults, space=space)

    def render(self, task: "Task", params: dict[str, Any], sizes: tuple[str, ...]) -> str:
        shapes = [_shape(task, s) for s in sizes]
        failed = next((s for s in shapes if isinstance(s, str)), None)
        if failed is not None:
            raise ValueError(failed)
        a = shapes[0]
        assert not isinstance(a, str)
        causal = _mask_kind(a) == "causal"
        backend = str(params.get("backend", "triton"))
        if all(math.isclose(s.scale, s.head_dim ** -0.5, rel_tol=1e-6) for s in shapes):  # type: ignore[union-attr]
            scale: float | None = None
        elif len({s.scale for s in shapes}) == 1:  # type: ignore[union-attr]
            scale = a.scale
        else:
            raise ValueError("the softmax scale differs between sizes in a way the GPU template cannot follow")
        return render_source(
            block_q=int(params["block_q"]), block_k=int(params["block_k"]), causal=causal,
            scale=scale, out_dtype=np.dtype(a.out_dtype).name, backend=backend,
            compiler=compiler_params_text(backend, int(params["num_warps"]), int(params["num_stages"])))


def render_source(block_q: int, block_k: int, causal: bool, scale: float | None, out_dtype: str, backend: str,
                  compiler: str) -> str:
    """The candidate file: shape-generic (blocks shrink to fit smaller sequences), one pallas_call. ``scale``
    None: 1 / sqrt(head_dim) of the inputs at hand."""
    scale_text = "None  # 1 / sqrt(head_dim)" if scale is None else repr(scale)
    limit = ("# Causal: key blocks past this query block's last row are never visited.\n"
             "    stop = jnp.minimum(seq, (i + 1) * bq) // bk\n" if causal else "    stop = seq // bk\n")
    mask = ("        rows = i * bq + jax.lax.broadcasted_iota(jnp.int32, (bq, bk), 0)\n"
            "        cols = j * bk + jax.lax.broadcasted_iota(jnp.int32, (bq, bk), 1)\n"
            "        s = jnp.where(cols <= rows, s, -jnp.inf)\n" if causal else "")
    return f'''"""Flash attention for NVIDIA GPUs ({backend}): a program per (batch, head, query block) streams key and
value blocks with an online softmax{"; causal, so it stops at the diagonal" if causal else ""}."""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
{backend_import(backend)}

BLOCK_Q = {block_q}
BLOCK_K = {block_k}
SCALE = {scale_text}


def _fit(block, extent):
    """The block, halved until it divides the extent (the whole extent when that is smaller)."""
    block = min(block, extent)
    while extent % block:
        block //= 2
    return block


def _attention_body(q_ref, k_ref, v_ref, o_ref, *, bq, bk, seq, scale):
    i = pl.program_id(2)
    q = q_ref[...]
    {limit.strip()}

    def step(j, carry):
        acc, m, l = carry
        k = k_ref[pl.ds(j * bk, bk), :]
        v = v_ref[pl.ds(j * bk, bk), :]
        s = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32) * scale
{mask}        m_new = jnp.maximum(m, jnp.max(s, axis=1))
        p = jnp.exp(s - m_new[:, None])
        alpha = jnp.exp(m - m_new)
        l_new = alpha * l + jnp.sum(p, axis=1)
        acc = acc * alpha[:, None] + jnp.dot(p.astype(v.dtype), v, preferred_element_type=jnp.float32)
        return acc, m_new, l_new

    d = q.shape[-1]
    init = (jnp.zeros((bq, d), jnp.float32), jnp.full((bq,), -jnp.inf, jnp.float32), jnp.zeros((bq,), jnp.float32))
    acc, _, l = jax.lax.fori_loop(0, stop, step, init)
    o_ref[...] = (acc / l[:, None]).astype(o_ref.dtype)


def kernel(q, k, v):
    batch, heads, seq, d = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    bq, bk = _fit(BLOCK_Q, seq), _fit(BLOCK_K, seq)
    scale = d ** -0.5 if SCALE is None else SCALE
    body = functools.partial(_attention_body, bq=bq, bk=bk, seq=seq, scale=scale)
    return pl.pallas_call(
        body,
        grid=(batch, heads, seq // bq),
        in_specs=[
            pl.BlockSpec((None, None, bq, d), lambda b, h, i: (b, h, i, 0)),
            pl.BlockSpec((None, None, seq, d), lambda b, h, i: (b, h // group, 0, 0)),
            pl.BlockSpec((None, None, seq, d), lambda b, h, i: (b, h // group, 0, 0)),
        ],
        out_specs=pl.BlockSpec((None, None, bq, d), lambda b, h, i: (b, h, i, 0)),
        out_shape=jax.ShapeDtypeStruct(q.shape, jnp.{out_dtype}),
        compiler_params={compiler},
    )(q, k, v)
'''


GPU_FLASH_ATTENTION = GpuFlashAttentionTemplate()
