"""Grouped (ragged) matmul as in jax.lax.ragged_dot: consecutive row blocks of lhs use their own rhs matrix.

Rows [start_i, start_i + group_sizes[i]) of lhs are multiplied by rhs[i]; group sizes are very unequal
(one group is always empty) and always sum to the number of rows. bfloat16 inputs, float32
accumulation, bfloat16 output.
"""

import jax
import jax.numpy as jnp


def _ragged_sizes(key, total, groups):
    """Very unequal non-negative int32 sizes summing to ``total``; one randomly chosen group is empty."""
    kw, kz = jax.random.split(key)
    weights = jnp.exp(1.5 * jax.random.normal(kw, (groups,), jnp.float32))
    empty = jax.random.randint(kz, (), 0, groups)
    weights = weights.at[empty].set(0.0)
    sizes = jnp.floor(weights / jnp.sum(weights) * total).astype(jnp.int32)
    leftover = total - jnp.sum(sizes)
    return sizes.at[jnp.argmax(sizes)].add(leftover)


def get_inputs(key, *, m, k, n, num_groups):
    kl, kr, kg = jax.random.split(key, 3)
    lhs = jax.random.normal(kl, (m, k), jnp.float32).astype(jnp.bfloat16)
    rhs = (jax.random.normal(kr, (num_groups, k, n), jnp.float32) / jnp.sqrt(float(k))).astype(jnp.bfloat16)
    group_sizes = _ragged_sizes(kg, m, num_groups)
    return (lhs, rhs, group_sizes), {}


def reference(lhs, rhs, group_sizes):
    out = jax.lax.ragged_dot(lhs, rhs, group_sizes, preferred_element_type=jnp.float32)
    return out.astype(jnp.bfloat16)
