"""Linear layer, scale, x + x, clamp, row-wise logsumexp, then z * mish(z)."""

import jax
import jax.numpy as jnp
from jax import lax

_HI = lax.Precision.HIGHEST


def get_inputs(key, *, batch, input_size, hidden_size):
    kx, kw, kb = jax.random.split(key, 3)
    x = jax.random.normal(kx, (batch, input_size), jnp.float32)
    weight = jax.random.normal(kw, (hidden_size, input_size), jnp.float32) * (1.0 / input_size) ** 0.5
    bias = 0.2 * jax.random.normal(kb, (hidden_size,), jnp.float32)
    static = {"scale_factor": 2.0, "clamp_min": -10.0, "clamp_max": 10.0}
    return (x, weight, bias), static


def _mish(v):
    return v * jnp.tanh(jax.nn.softplus(v))


def reference(x, weight, bias, *, scale_factor, clamp_min, clamp_max):
    h = jnp.dot(x, weight.T, precision=_HI) + bias
    h = h * scale_factor
    h = h + h
    h = jnp.clip(h, clamp_min, clamp_max)
    z = jax.nn.logsumexp(h, axis=1, keepdims=True)        # [batch, 1]
    return z * _mish(z)
