"""Linear layer, add a learned vector, then Swish, tanh, exact GELU and hardtanh (KernelBench level 2 #95)."""

import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, in_features, out_features):
    kx, kw, kb, ka = jax.random.split(key, 4)
    bound = 1.0 / in_features**0.5
    x = jax.random.normal(kx, (batch, in_features), jnp.float32)
    weight = jax.random.uniform(kw, (out_features, in_features), jnp.float32, -bound, bound)
    linear_bias = jax.random.uniform(kb, (out_features,), jnp.float32, -bound, bound)
    add_value = jax.random.normal(ka, (out_features,), jnp.float32)
    return (x, weight, linear_bias, add_value), {}


def reference(x, weight, linear_bias, add_value):
    h = jnp.matmul(x, weight.T, precision=jax.lax.Precision.HIGHEST) + linear_bias
    h = h + add_value
    h = h * jax.nn.sigmoid(h)
    h = jnp.tanh(h)
    h = jax.nn.gelu(h, approximate=False)
    return jnp.clip(h, -1.0, 1.0)
