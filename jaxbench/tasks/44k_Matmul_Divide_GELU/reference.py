"""Linear layer, division by a constant, exact GELU (KernelBench level 2 #86)."""

import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, in_features, out_features):
    kx, kw, kb = jax.random.split(key, 3)
    bound = 1.0 / in_features**0.5
    # Activations with std 4 so that, after the division by 10, GELU sees inputs of order 0.5.
    x = 4.0 * jax.random.normal(kx, (batch, in_features), jnp.float32)
    weight = jax.random.uniform(kw, (out_features, in_features), jnp.float32, -bound, bound)
    linear_bias = jax.random.uniform(kb, (out_features,), jnp.float32, -bound, bound)
    return (x, weight, linear_bias), {"divisor": 10.0}


def reference(x, weight, linear_bias, *, divisor):
    h = jnp.matmul(x, weight.T, precision=jax.lax.Precision.HIGHEST) + linear_bias
    return jax.nn.gelu(h / divisor, approximate=False)
