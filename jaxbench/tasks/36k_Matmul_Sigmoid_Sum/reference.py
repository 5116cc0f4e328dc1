"""Linear layer, sigmoid, then the sum over features of every row (keepdims)."""

import jax
import jax.numpy as jnp

_HI = jax.lax.Precision.HIGHEST


def get_inputs(key, *, batch, input_size, hidden_size):
    kx, kw, kb = jax.random.split(key, 3)
    x = jax.random.normal(kx, (batch, input_size), jnp.float32)
    w = jax.random.normal(kw, (hidden_size, input_size), jnp.float32) * (2.0 / input_size**0.5)
    b = 0.5 * jax.random.normal(kb, (hidden_size,), jnp.float32)
    return (x, w, b), {}


def reference(x, w, b):
    h = jax.nn.sigmoid(jnp.matmul(x, w.T, precision=_HI) + b)
    return jnp.sum(h, axis=1, keepdims=True)
