"""Causal multi-head self-attention: softmax(Q K^T / sqrt(d) + causal mask) V, bf16 in and out."""

import math

import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, heads, seq, head_dim):
    kq, kk, kv = jax.random.split(key, 3)
    shape = (batch, heads, seq, head_dim)
    # q and k slightly above unit scale so the softmax is peaked but far from one-hot.
    q = (1.5 * jax.random.normal(kq, shape, jnp.float32)).astype(jnp.bfloat16)
    k = (1.5 * jax.random.normal(kk, shape, jnp.float32)).astype(jnp.bfloat16)
    v = jax.random.normal(kv, shape, jnp.float32).astype(jnp.bfloat16)
    return (q, k, v), {}


def reference(q, k, v):
    seq, head_dim = q.shape[-2], q.shape[-1]
    qf, kf, vf = (t.astype(jnp.float32) for t in (q, k, v))
    scores = jnp.einsum("bhqd,bhkd->bhqk", qf, kf) / math.sqrt(head_dim)
    row = jnp.arange(seq)[:, None]
    col = jnp.arange(seq)[None, :]
    scores = jnp.where(col <= row, scores, -jnp.inf)
    m = jnp.max(scores, axis=-1, keepdims=True)
    p = jnp.exp(scores - m)
    denom = jnp.sum(p, axis=-1, keepdims=True)
    out = jnp.einsum("bhqk,bhkd->bhqd", p, vf) / denom
    return out.astype(jnp.bfloat16)
