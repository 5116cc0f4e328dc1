"""Causal attention with a learned per-head relative-position bias (clipped distance buckets)."""

import math

import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, heads, seq, head_dim, num_buckets):
    kq, kk, kv, kb = jax.random.split(key, 4)
    shape = (batch, heads, seq, head_dim)
    q = (1.5 * jax.random.normal(kq, shape, jnp.float32)).astype(jnp.bfloat16)
    k = (1.5 * jax.random.normal(kk, shape, jnp.float32)).astype(jnp.bfloat16)
    v = jax.random.normal(kv, shape, jnp.float32).astype(jnp.bfloat16)
    bias_table = jax.random.normal(kb, (heads, num_buckets), jnp.float32).astype(jnp.bfloat16)
    return (q, k, v, bias_table), {}


def reference(q, k, v, bias_table):
    seq, head_dim = q.shape[-2], q.shape[-1]
    num_buckets = bias_table.shape[-1]
    qf, kf, vf = (t.astype(jnp.float32) for t in (q, k, v))
    rel = jnp.arange(seq)[:, None] - jnp.arange(seq)[None, :]  # query minus key position
    bucket = jnp.clip(rel, 0, num_buckets - 1)
    bias = bias_table.astype(jnp.float32)[:, bucket]  # [heads, seq, seq]
    scores = jnp.einsum("bhqd,bhkd->bhqk", qf, kf) / math.sqrt(head_dim) + bias[None]
    scores = jnp.where(rel >= 0, scores, -jnp.inf)
    m = jnp.max(scores, axis=-1, keepdims=True)
    p = jnp.exp(scores - m)
    denom = jnp.sum(p, axis=-1, keepdims=True)
    out = jnp.einsum("bhqk,bhkd->bhqd", p, vf) / denom
    return out.astype(jnp.bfloat16)
