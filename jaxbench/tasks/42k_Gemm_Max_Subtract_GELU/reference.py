"""Linear layer, max over the batch axis, centering across features, exact GELU.

KernelBench level 2 #80 takes the max over dim=1 (features); its following mean over dim=1 of a
[B, 1] tensor then cancels it exactly and the output is identically zero. This task reduces over
dim=0 (the batch) instead, so the chain stays non-trivial; the output is [1, N].
"""

import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, in_features, out_features):
    kx, kw, kb = jax.random.split(key, 3)
    bound = 1.0 / in_features**0.5
    x = jax.random.normal(kx, (batch, in_features), jnp.float32)
    weight = jax.random.uniform(kw, (out_features, in_features), jnp.float32, -bound, bound)
    linear_bias = jax.random.uniform(kb, (out_features,), jnp.float32, -bound, bound)
    return (x, weight, linear_bias), {"max_dim": 0}


def reference(x, weight, linear_bias, *, max_dim):
    h = jnp.matmul(x, weight.T, precision=jax.lax.Precision.HIGHEST) + linear_bias
    h = jnp.max(h, axis=max_dim, keepdims=True)
    h = h - jnp.mean(h, axis=1, keepdims=True)
    return jax.nn.gelu(h, approximate=False)
