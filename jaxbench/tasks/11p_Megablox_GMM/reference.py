"""Grouped matmul (Megablox GMM): consecutive row blocks of lhs each multiply their own rhs matrix."""

import jax
import jax.numpy as jnp


def get_inputs(key, *, m, k, n, num_groups):
    kl, kr, kg = jax.random.split(key, 3)
    lhs = jax.random.normal(kl, (m, k), jnp.float32).astype(jnp.bfloat16)
    rhs = (jax.random.normal(kr, (num_groups, k, n), jnp.float32) / k**0.5).astype(jnp.bfloat16)
    # Unequal group sizes summing to m: sorted random cut points in [0, m] (a group may be empty).
    cuts = jnp.sort(jax.random.randint(kg, (num_groups - 1,), 0, m + 1, dtype=jnp.int32))
    bounds = jnp.concatenate([jnp.zeros((1,), jnp.int32), cuts, jnp.full((1,), m, jnp.int32)])
    group_sizes = jnp.diff(bounds).astype(jnp.int32)
    return (lhs, group_sizes, rhs), {}


def reference(lhs, group_sizes, rhs):
    m = lhs.shape[0]
    ends = jnp.cumsum(group_sizes)
    starts = ends - group_sizes
    rows = jnp.arange(m, dtype=jnp.int32)[:, None]
    out = jnp.zeros((m, rhs.shape[2]), jnp.float32)
    for g in range(rhs.shape[0]):
        in_group = (rows >= starts[g]) & (rows < ends[g])
        part = jnp.dot(lhs, rhs[g], preferred_element_type=jnp.float32)
        out = jnp.where(in_group, part, out)
    return out.astype(jnp.bfloat16)
