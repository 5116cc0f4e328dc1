"""Rotary position embedding (rotate-half convention) applied to queries at arbitrary token positions."""

import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, seq_len, num_heads, head_dim, max_position):
    kq, kp = jax.random.split(key)
    q = jax.random.normal(kq, (batch, seq_len, num_heads, head_dim), jnp.float32).astype(jnp.bfloat16)
    position_ids = jax.random.randint(kp, (batch, seq_len), 0, max_position, dtype=jnp.int32)
    return (q, position_ids), {"base": 10000.0}


def rotate_half(x):
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate((-x2, x1), axis=-1)


def reference(q, position_ids, base):
    head_dim = q.shape[-1]
    inv_freq = 1.0 / (base ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    freqs = position_ids[..., None].astype(jnp.float32) * inv_freq  # [batch, seq, head_dim / 2]
    emb = jnp.concatenate((freqs, freqs), axis=-1)
    cos = jnp.cos(emb)[:, :, None, :]
    sin = jnp.sin(emb)[:, :, None, :]
    qf = q.astype(jnp.float32)
    return (qf * cos + rotate_half(qf) * sin).astype(q.dtype)
