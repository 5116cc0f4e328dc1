"""Linear layer, GroupNorm over features, min over features, then a broadcast bias add.

Mirrors KernelBench level 2 #75: the (batch, 1) row minima are added to a (1, C, 1, 1) bias, which
PyTorch broadcasting turns into a (1, C, batch, 1) output.
"""

import jax
import jax.numpy as jnp

_HI = jax.lax.Precision.HIGHEST


def get_inputs(key, *, batch, in_features, out_features, num_groups):
    kx, kw, kb, kg, kbeta, kbias = jax.random.split(key, 6)
    bound = 1.0 / in_features**0.5
    x = jax.random.normal(kx, (batch, in_features), jnp.float32)
    weight = jax.random.uniform(kw, (out_features, in_features), jnp.float32, -bound, bound)
    linear_bias = jax.random.uniform(kb, (out_features,), jnp.float32, -bound, bound)
    gn_weight = 1.0 + 0.2 * jax.random.normal(kg, (out_features,), jnp.float32)
    gn_bias = 0.2 * jax.random.normal(kbeta, (out_features,), jnp.float32)
    bias = jax.random.normal(kbias, (1, out_features, 1, 1), jnp.float32)
    return (x, weight, linear_bias, gn_weight, gn_bias, bias), {"num_groups": num_groups, "eps": 1e-5}


def reference(x, weight, linear_bias, gn_weight, gn_bias, bias, *, num_groups, eps):
    h = jnp.matmul(x, weight.T, precision=_HI) + linear_bias
    n, c = h.shape
    g = h.reshape(n, num_groups, c // num_groups)
    mean = jnp.mean(g, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(g - mean), axis=-1, keepdims=True)
    h = ((g - mean) * jax.lax.rsqrt(var + eps)).reshape(n, c) * gn_weight + gn_bias
    row_min = jnp.min(h, axis=1)  # (batch,)
    return row_min.reshape(1, 1, n, 1) + bias  # (1, C, batch, 1)
