"""Softmax over long rows of logits divided by a temperature, with padded key positions masked out."""

import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, rows, cols):
    k1, k2 = jax.random.split(key)
    logits = 3.0 * jax.random.normal(k1, (batch, rows, cols), jnp.float32)
    # Key-padding mask, one per batch element: about 10% of the columns are padding.
    keep = jax.random.bernoulli(k2, 0.9, (batch, cols))
    keep = keep.at[:, 0].set(True)  # every row keeps at least one column
    return (logits, keep), {"temperature": 0.7}


def reference(logits, keep, *, temperature):
    z = logits / temperature
    z = jnp.where(keep[:, None, :], z, -jnp.inf)
    z = z - jnp.max(z, axis=-1, keepdims=True)
    e = jnp.exp(z)
    return e / jnp.sum(e, axis=-1, keepdims=True)
