"""Linear layer, sum over features (keepdims), then max / mean / logsumexp / logsumexp over that size-1 axis."""

import jax
import jax.numpy as jnp
from jax import lax

_HI = lax.Precision.HIGHEST


def get_inputs(key, *, batch, in_features, out_features):
    kx, kw, kb = jax.random.split(key, 3)
    x = jax.random.normal(kx, (batch, in_features), jnp.float32)
    weight = jax.random.normal(kw, (out_features, in_features), jnp.float32) * (1.0 / in_features) ** 0.5
    bias = 0.2 * jax.random.normal(kb, (out_features,), jnp.float32)
    return (x, weight, bias), {}


def reference(x, weight, bias):
    h = jnp.dot(x, weight.T, precision=_HI) + bias
    h = jnp.sum(h, axis=1, keepdims=True)                 # [batch, 1]
    h = jnp.max(h, axis=1, keepdims=True)                 # over a size-1 axis: identity
    h = jnp.mean(h, axis=1, keepdims=True)                # identity
    h = jax.nn.logsumexp(h, axis=1, keepdims=True)        # identity (single element)
    h = jax.nn.logsumexp(h, axis=1, keepdims=True)        # identity
    return h
