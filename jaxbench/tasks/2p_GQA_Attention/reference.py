"""Causal grouped-query attention: each group of query heads shares one key/value head."""

import math

import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, q_heads, kv_heads, seq, head_dim):
    kq, kk, kv = jax.random.split(key, 3)
    q = (1.5 * jax.random.normal(kq, (batch, q_heads, seq, head_dim), jnp.float32)).astype(jnp.bfloat16)
    k = (1.5 * jax.random.normal(kk, (batch, kv_heads, seq, head_dim), jnp.float32)).astype(jnp.bfloat16)
    v = jax.random.normal(kv, (batch, kv_heads, seq, head_dim), jnp.float32).astype(jnp.bfloat16)
    return (q, k, v), {}


def reference(q, k, v):
    batch, q_heads, seq, head_dim = q.shape
    kv_heads = k.shape[1]
    group = q_heads // kv_heads
    # Query head h reads kv head h // group: view q as [batch, kv_heads, group, seq, head_dim].
    qf = q.astype(jnp.float32).reshape(batch, kv_heads, group, seq, head_dim)
    kf, vf = k.astype(jnp.float32), v.astype(jnp.float32)
    scores = jnp.einsum("bngqd,bnkd->bngqk", qf, kf) / math.sqrt(head_dim)
    causal = jnp.arange(seq)[None, :] <= jnp.arange(seq)[:, None]
    scores = jnp.where(causal, scores, -jnp.inf)
    m = jnp.max(scores, axis=-1, keepdims=True)
    p = jnp.exp(scores - m)
    denom = jnp.sum(p, axis=-1, keepdims=True)
    out = jnp.einsum("bngqk,bnkd->bngqd", p, vf) / denom
    return out.reshape(batch, q_heads, seq, head_dim).astype(jnp.bfloat16)
