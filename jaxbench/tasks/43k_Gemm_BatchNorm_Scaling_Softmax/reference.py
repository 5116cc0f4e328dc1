"""Linear layer, training-mode BatchNorm1d (batch statistics), scalar scale, softmax over features."""

import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, in_features, out_features):
    kx, kw, kb, kg, kbeta, ks = jax.random.split(key, 6)
    bound = 1.0 / in_features**0.5
    x = jax.random.normal(kx, (batch, in_features), jnp.float32)
    weight = jax.random.uniform(kw, (out_features, in_features), jnp.float32, -bound, bound)
    linear_bias = jax.random.uniform(kb, (out_features,), jnp.float32, -bound, bound)
    bn_weight = 1.0 + 0.2 * jax.random.normal(kg, (out_features,), jnp.float32)
    bn_bias = 0.2 * jax.random.normal(kbeta, (out_features,), jnp.float32)
    scale = 1.0 + 0.25 * jax.random.normal(ks, (1,), jnp.float32)
    return (x, weight, linear_bias, bn_weight, bn_bias, scale), {"eps": 1e-5}


def reference(x, weight, linear_bias, bn_weight, bn_bias, scale, *, eps):
    h = jnp.matmul(x, weight.T, precision=jax.lax.Precision.HIGHEST) + linear_bias
    mean = jnp.mean(h, axis=0, keepdims=True)
    var = jnp.mean(jnp.square(h - mean), axis=0, keepdims=True)
    h = (h - mean) * jax.lax.rsqrt(var + eps) * bn_weight + bn_bias
    return jax.nn.softmax(scale * h, axis=1)
