"""Linear layer, exact GELU, softmax over the features (KernelBench level 2 #99)."""

import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, in_features, out_features):
    kx, kw, kb = jax.random.split(key, 3)
    bound = 1.0 / in_features**0.5
    x = jax.random.normal(kx, (batch, in_features), jnp.float32)
    weight = jax.random.uniform(kw, (out_features, in_features), jnp.float32, -bound, bound)
    linear_bias = jax.random.uniform(kb, (out_features,), jnp.float32, -bound, bound)
    return (x, weight, linear_bias), {}


def reference(x, weight, linear_bias):
    h = jnp.matmul(x, weight.T, precision=jax.lax.Precision.HIGHEST) + linear_bias
    return jax.nn.softmax(jax.nn.gelu(h, approximate=False), axis=1)
