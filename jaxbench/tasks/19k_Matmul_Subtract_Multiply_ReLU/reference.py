"""Linear layer (x @ W^T + b), subtract a constant, multiply by a constant, ReLU."""

import jax
import jax.numpy as jnp
from jax import lax

_HI = lax.Precision.HIGHEST


def get_inputs(key, *, batch, in_features, out_features):
    kx, kw, kb = jax.random.split(key, 3)
    subtract_value = 2.0
    x = jax.random.normal(kx, (batch, in_features), jnp.float32)
    weight = jax.random.normal(kw, (out_features, in_features), jnp.float32) * (1.0 / in_features) ** 0.5
    # Bias centred on subtract_value so that roughly half of the units survive the ReLU.
    bias = subtract_value + 0.5 * jax.random.normal(kb, (out_features,), jnp.float32)
    return (x, weight, bias), {"subtract_value": subtract_value, "multiply_value": 1.5}


def reference(x, weight, bias, *, subtract_value, multiply_value):
    y = jnp.dot(x, weight.T, precision=_HI) + bias
    y = (y - subtract_value) * multiply_value
    return jnp.maximum(y, 0.0)
