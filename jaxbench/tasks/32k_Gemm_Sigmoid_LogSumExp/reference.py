"""Two-layer MLP with a sigmoid between the layers, reduced per row by logsumexp."""

import jax
import jax.numpy as jnp

_HI = jax.lax.Precision.HIGHEST


def get_inputs(key, *, batch, input_size, hidden_size, output_size):
    kx, k1, kb1, k2, kb2 = jax.random.split(key, 5)
    x = jax.random.normal(kx, (batch, input_size), jnp.float32)
    w1 = jax.random.normal(k1, (hidden_size, input_size), jnp.float32) * (1.5 / input_size**0.5)
    b1 = 0.3 * jax.random.normal(kb1, (hidden_size,), jnp.float32)
    w2 = jax.random.normal(k2, (output_size, hidden_size), jnp.float32) * (4.0 / hidden_size**0.5)
    b2 = 0.5 * jax.random.normal(kb2, (output_size,), jnp.float32)
    return (x, w1, b1, w2, b2), {}


def reference(x, w1, b1, w2, b2):
    h = jax.nn.sigmoid(jnp.matmul(x, w1.T, precision=_HI) + b1)
    logits = jnp.matmul(h, w2.T, precision=_HI) + b2
    m = jnp.max(logits, axis=1, keepdims=True)
    return (m + jnp.log(jnp.sum(jnp.exp(logits - m), axis=1, keepdims=True)))[:, 0]
