"""RetNet parallel retention: causal, per-head exponentially decayed Q K^T scores applied to V, then a
per-head group norm over the head dimension."""

import math

import jax
import jax.numpy as jnp

_HI = jax.lax.Precision.HIGHEST


def get_inputs(key, *, batch, heads, seq, head_dim):
    kq, kk, kv = jax.random.split(key, 3)
    shape = (batch, heads, seq, head_dim)
    q = jax.random.normal(kq, shape, jnp.float32)
    k = jax.random.normal(kk, shape, jnp.float32)
    v = jax.random.normal(kv, shape, jnp.float32)
    return (q, k, v), {"eps": 1e-5}


def _log_decays(heads):
    # gamma_h = 1 - 2^(-5-h); log taken in double precision on the host, then stored as float32.
    return jnp.asarray([math.log1p(-(2.0 ** (-5 - h))) for h in range(heads)], jnp.float32)


def reference(q, k, v, *, eps):
    _, heads, seq, head_dim = q.shape
    pos = jnp.arange(seq)
    dist = (pos[:, None] - pos[None, :]).astype(jnp.float32)  # n - m
    causal = pos[:, None] >= pos[None, :]
    log_g = _log_decays(heads)[:, None, None]
    decay = jnp.where(causal[None], jnp.exp(jnp.where(causal[None], dist[None], 0.0) * log_g), 0.0)
    scores = jnp.einsum("bhnd,bhmd->bhnm", q, k * (head_dim**-0.5), precision=_HI)
    ret = jnp.einsum("bhnm,bhmd->bhnd", scores * decay[None], v, precision=_HI)
    mean = jnp.mean(ret, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(ret - mean), axis=-1, keepdims=True)
    return (ret - mean) * jax.lax.rsqrt(var + eps)
