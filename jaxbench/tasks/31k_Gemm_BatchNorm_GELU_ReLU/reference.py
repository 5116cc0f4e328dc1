"""Linear layer, training-mode BatchNorm1d (batch statistics), exact GELU, then ReLU."""

import jax
import jax.numpy as jnp

_HI = jax.lax.Precision.HIGHEST


def get_inputs(key, *, batch, in_features, out_features):
    kx, kw, kg, kh = jax.random.split(key, 4)
    x = jax.random.normal(kx, (batch, in_features), jnp.float32)
    w = jax.random.normal(kw, (out_features, in_features), jnp.float32) / in_features**0.5
    gamma = 1.0 + 0.3 * jax.random.normal(kg, (out_features,), jnp.float32)
    beta = 0.3 * jax.random.normal(kh, (out_features,), jnp.float32)
    return (x, w, gamma, beta), {"eps": 1e-5}


def reference(x, w, gamma, beta, *, eps):
    # The Linear bias is left out: batch-statistics BatchNorm subtracts the per-feature batch
    # mean, which cancels any per-feature constant exactly.
    h = jnp.matmul(x, w.T, precision=_HI)
    mean = jnp.mean(h, axis=0, keepdims=True)
    var = jnp.mean(jnp.square(h - mean), axis=0, keepdims=True)
    z = (h - mean) * jax.lax.rsqrt(var + eps) * gamma + beta
    return jax.nn.relu(jax.nn.gelu(z, approximate=False))
