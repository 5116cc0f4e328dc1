"""Linear layer whose output is scaled and added back to itself: y = h * scale + h."""

import jax
import jax.numpy as jnp

_HI = jax.lax.Precision.HIGHEST


def get_inputs(key, *, batch, in_features, out_features):
    kx, kw, kb = jax.random.split(key, 3)
    x = jax.random.normal(kx, (batch, in_features), jnp.float32)
    w = jax.random.normal(kw, (out_features, in_features), jnp.float32) / in_features**0.5
    b = 0.2 * jax.random.normal(kb, (out_features,), jnp.float32)
    return (x, w, b), {"scaling_factor": 0.5}


def reference(x, w, b, *, scaling_factor):
    h = jnp.matmul(x, w.T, precision=_HI) + b
    residual = h
    return h * scaling_factor + residual
