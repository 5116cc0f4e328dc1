"""Block-sparse causal attention: each query block sees a sliding window of key blocks plus the
first few (global) key blocks; all other key blocks get zero weight."""

import math

import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, heads, seq, head_dim, block_size, window_blocks, global_blocks):
    kq, kk, kv = jax.random.split(key, 3)
    shape = (batch, heads, seq, head_dim)
    q = (1.5 * jax.random.normal(kq, shape, jnp.float32)).astype(jnp.bfloat16)
    k = (1.5 * jax.random.normal(kk, shape, jnp.float32)).astype(jnp.bfloat16)
    v = jax.random.normal(kv, shape, jnp.float32).astype(jnp.bfloat16)
    static = {"block_size": block_size, "window_blocks": window_blocks, "global_blocks": global_blocks}
    return (q, k, v), static


def reference(q, k, v, *, block_size, window_blocks, global_blocks):
    seq, head_dim = q.shape[-2], q.shape[-1]
    qf, kf, vf = (t.astype(jnp.float32) for t in (q, k, v))
    pos = jnp.arange(seq)
    qb = (pos // block_size)[:, None]
    kb = (pos // block_size)[None, :]
    block_visible = ((kb <= qb) & (kb > qb - window_blocks)) | (kb < global_blocks)
    mask = block_visible & (pos[None, :] <= pos[:, None])  # token-level causality inside blocks
    scores = jnp.einsum("bhqd,bhkd->bhqk", qf, kf) / math.sqrt(head_dim)
    scores = jnp.where(mask, scores, -jnp.inf)
    m = jnp.max(scores, axis=-1, keepdims=True)
    p = jnp.exp(scores - m)
    denom = jnp.sum(p, axis=-1, keepdims=True)
    out = jnp.einsum("bhqk,bhkd->bhqd", p, vf) / denom
    return out.astype(jnp.bfloat16)
