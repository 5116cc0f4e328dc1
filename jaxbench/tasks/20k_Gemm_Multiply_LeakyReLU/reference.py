"""Linear layer (x @ W^T + b), multiply by a constant, LeakyReLU."""

import jax
import jax.numpy as jnp
from jax import lax

_HI = lax.Precision.HIGHEST


def get_inputs(key, *, batch, in_features, out_features):
    kx, kw, kb = jax.random.split(key, 3)
    x = jax.random.normal(kx, (batch, in_features), jnp.float32)
    weight = jax.random.normal(kw, (out_features, in_features), jnp.float32) * (1.0 / in_features) ** 0.5
    bias = 0.2 * jax.random.normal(kb, (out_features,), jnp.float32)
    return (x, weight, bias), {"multiplier": 2.0, "negative_slope": 0.1}


def reference(x, weight, bias, *, multiplier, negative_slope):
    y = (jnp.dot(x, weight.T, precision=_HI) + bias) * multiplier
    return jnp.where(y >= 0.0, y, negative_slope * y)
