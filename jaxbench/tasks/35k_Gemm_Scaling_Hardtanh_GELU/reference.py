"""Linear layer, scaling, hardtanh clamp to [-2, 2], then exact GELU."""

import jax
import jax.numpy as jnp

_HI = jax.lax.Precision.HIGHEST


def get_inputs(key, *, batch, in_features, out_features):
    kx, kw, kb = jax.random.split(key, 3)
    x = jax.random.normal(kx, (batch, in_features), jnp.float32)
    # Pre-activations of std ~3 so that, after the 0.5 scaling, a sizeable share gets clamped.
    w = jax.random.normal(kw, (out_features, in_features), jnp.float32) * (3.0 / in_features**0.5)
    b = 0.5 * jax.random.normal(kb, (out_features,), jnp.float32)
    static = {"scaling_factor": 0.5, "hardtanh_min": -2.0, "hardtanh_max": 2.0}
    return (x, w, b), static


def reference(x, w, b, *, scaling_factor, hardtanh_min, hardtanh_max):
    h = jnp.matmul(x, w.T, precision=_HI) + b
    h = jnp.clip(h * scaling_factor, hardtanh_min, hardtanh_max)
    return jax.nn.gelu(h, approximate=False)
