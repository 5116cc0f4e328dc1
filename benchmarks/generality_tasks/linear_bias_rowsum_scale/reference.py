"""Linear layer with bias, summed over its output features and scaled (a pooled score per row)."""

import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, in_features, out_features):
    kw, kb, kx = jax.random.split(key, 3)
    weight = jax.random.uniform(kw, (out_features, in_features), jnp.float32, -1.0, 1.0) / in_features**0.5
    bias = jax.random.uniform(kb, (out_features,), jnp.float32, -1.0, 1.0)
    inputs = jax.random.normal(kx, (batch, in_features), jnp.float32)
    return (inputs, weight, bias), {"scaling_factor": 0.5}


def reference(inputs, weight, bias, scaling_factor):
    y = jnp.dot(inputs, weight.T) + bias
    return jnp.sum(y, axis=1, keepdims=True) * scaling_factor
