"""Linear layer, training-mode dropout with a fixed PRNG key, then a row softmax."""

import jax
import jax.numpy as jnp

_HI = jax.lax.Precision.HIGHEST


def get_inputs(key, *, batch, in_features, out_features):
    kx, kw, kb, kd = jax.random.split(key, 4)
    x = jax.random.normal(kx, (batch, in_features), jnp.float32)
    w = jax.random.normal(kw, (out_features, in_features), jnp.float32) * (1.5 / in_features**0.5)
    b = 0.5 * jax.random.normal(kb, (out_features,), jnp.float32)
    dropout_key = jax.random.key_data(kd)  # raw uint32[2] (threefry2x32)
    return (x, w, b, dropout_key), {"dropout_p": 0.2}


def reference(x, w, b, dropout_key, *, dropout_p):
    h = jnp.matmul(x, w.T, precision=_HI) + b
    keep = jax.random.bernoulli(jax.random.wrap_key_data(dropout_key), 1.0 - dropout_p, h.shape)
    h = jnp.where(keep, h / (1.0 - dropout_p), 0.0)
    m = jnp.max(h, axis=1, keepdims=True)
    e = jnp.exp(h - m)
    return e / jnp.sum(e, axis=1, keepdims=True)
