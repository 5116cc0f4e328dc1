"""Bias-free linear layer, then a learned bias add and ReLU (KernelBench level 2 #76)."""

import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, in_features, out_features):
    kx, kw, kb = jax.random.split(key, 3)
    bound = 1.0 / in_features**0.5
    x = jax.random.normal(kx, (batch, in_features), jnp.float32)
    weight = jax.random.uniform(kw, (out_features, in_features), jnp.float32, -bound, bound)
    bias = 0.5 * jax.random.normal(kb, (out_features,), jnp.float32)
    return (x, weight, bias), {}


def reference(x, weight, bias):
    h = jnp.matmul(x, weight.T, precision=jax.lax.Precision.HIGHEST)
    return jnp.maximum(h + bias, 0.0)
