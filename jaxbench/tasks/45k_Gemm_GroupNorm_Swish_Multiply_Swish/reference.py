"""Linear layer, GroupNorm over features, Swish, per-feature multiply, Swish (KernelBench level 2 #88)."""

import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, in_features, out_features, num_groups):
    kx, kw, kb, kg, kbeta, km = jax.random.split(key, 6)
    bound = 1.0 / in_features**0.5
    x = jax.random.normal(kx, (batch, in_features), jnp.float32)
    weight = jax.random.uniform(kw, (out_features, in_features), jnp.float32, -bound, bound)
    linear_bias = jax.random.uniform(kb, (out_features,), jnp.float32, -bound, bound)
    gn_weight = 1.0 + 0.2 * jax.random.normal(kg, (out_features,), jnp.float32)
    gn_bias = 0.2 * jax.random.normal(kbeta, (out_features,), jnp.float32)
    multiply_weight = jax.random.normal(km, (out_features,), jnp.float32)
    args = (x, weight, linear_bias, gn_weight, gn_bias, multiply_weight)
    return args, {"num_groups": num_groups, "eps": 1e-5}


def reference(x, weight, linear_bias, gn_weight, gn_bias, multiply_weight, *, num_groups, eps):
    h = jnp.matmul(x, weight.T, precision=jax.lax.Precision.HIGHEST) + linear_bias
    n, c = h.shape
    g = h.reshape(n, num_groups, c // num_groups)
    mean = jnp.mean(g, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(g - mean), axis=-1, keepdims=True)
    h = ((g - mean) * jax.lax.rsqrt(var + eps)).reshape(n, c) * gn_weight + gn_bias
    h = h * jax.nn.sigmoid(h)
    h = h * multiply_weight
    return h * jax.nn.sigmoid(h)
