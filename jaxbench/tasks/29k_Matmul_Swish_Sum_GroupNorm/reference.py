"""Linear layer, Swish, a per-channel bias add, then GroupNorm over channel groups (per row)."""

import jax
import jax.numpy as jnp

_HI = jax.lax.Precision.HIGHEST


def get_inputs(key, *, batch, in_features, out_features):
    kx, kw, kb, kc, kg, kh = jax.random.split(key, 6)
    x = jax.random.normal(kx, (batch, in_features), jnp.float32)
    w = jax.random.normal(kw, (out_features, in_features), jnp.float32) * (1.5 / in_features**0.5)
    b = 0.2 * jax.random.normal(kb, (out_features,), jnp.float32)
    extra_bias = 0.3 * jax.random.normal(kc, (out_features,), jnp.float32)
    gamma = 1.0 + 0.2 * jax.random.normal(kg, (out_features,), jnp.float32)
    beta = 0.2 * jax.random.normal(kh, (out_features,), jnp.float32)
    return (x, w, b, extra_bias, gamma, beta), {"num_groups": 64, "eps": 1e-5}


def reference(x, w, b, extra_bias, gamma, beta, *, num_groups, eps):
    y = jnp.matmul(x, w.T, precision=_HI) + b
    y = y * jax.nn.sigmoid(y)
    y = y + extra_bias
    rows, feats = y.shape
    g = y.reshape(rows, num_groups, feats // num_groups)
    mean = jnp.mean(g, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(g - mean), axis=-1, keepdims=True)
    g = (g - mean) * jax.lax.rsqrt(var + eps)
    return g.reshape(rows, feats) * gamma + beta
