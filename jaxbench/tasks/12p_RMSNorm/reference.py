"""RMSNorm over the last axis with a learned per-channel scale."""

import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, seq, hidden):
    kx, kw = jax.random.split(key)
    x = jax.random.normal(kx, (batch, seq, hidden), jnp.float32) * 2.0 + 0.5
    weight = 1.0 + 0.1 * jax.random.normal(kw, (hidden,), jnp.float32)
    return (x, weight), {"eps": 1e-6}


def reference(x, weight, *, eps):
    ms = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
    return x * jax.lax.rsqrt(ms + eps) * weight
