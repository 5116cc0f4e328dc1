"""Plain matrix multiply C = A @ B: bfloat16 operands, float32 accumulation, bfloat16 result."""

import jax
import jax.numpy as jnp


def get_inputs(key, *, m, k, n):
    ka, kb = jax.random.split(key)
    a = jax.random.normal(ka, (m, k), jnp.float32).astype(jnp.bfloat16)
    # 1/sqrt(k) keeps every entry of C at unit scale whatever the contraction length.
    b = (jax.random.normal(kb, (k, n), jnp.float32) / (k**0.5)).astype(jnp.bfloat16)
    return (a, b), {}


def reference(a, b):
    acc = jnp.dot(a, b, preferred_element_type=jnp.float32)
    return acc.astype(jnp.bfloat16)
