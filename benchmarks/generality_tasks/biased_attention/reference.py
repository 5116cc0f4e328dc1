"""Bidirectional (non-causal) multi-head attention with an additive per-head bias on the scores, float32."""

import math

import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, heads, seq, head_dim):
    kq, kk, kv, kb = jax.random.split(key, 4)
    shape = (batch, heads, seq, head_dim)
    q = jax.random.normal(kq, shape, jnp.float32)
    k = jax.random.normal(kk, shape, jnp.float32)
    v = jax.random.normal(kv, shape, jnp.float32)
    attn_bias = jax.random.normal(kb, (heads, seq, seq), jnp.float32)
    return (q, k, v, attn_bias), {}


def reference(q, k, v, attn_bias):
    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(q.shape[-1])
    scores = scores + attn_bias[None]
    weights = jax.nn.softmax(scores, axis=-1)
    return jnp.einsum("bhqk,bhkd->bhqd", weights, v)
