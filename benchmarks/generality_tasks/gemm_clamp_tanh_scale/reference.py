"""Projection with a bounded epilogue: scale * tanh(clamp(x @ w, lo, hi)), float32 at default precision."""

import jax
import jax.numpy as jnp


def get_inputs(key, *, tokens, d_in, d_out):
    k1, k2 = jax.random.split(key)
    x = jax.random.normal(k1, (tokens, d_in), dtype=jnp.float32)
    w = jax.random.normal(k2, (d_in, d_out), dtype=jnp.float32) / d_in**0.5
    return (x, w), {"lo": -2.0, "hi": 2.0, "scale": 0.5}


def reference(x, w, *, lo, hi, scale):
    h = x @ w
    return scale * jnp.tanh(jnp.clip(h, lo, hi))
