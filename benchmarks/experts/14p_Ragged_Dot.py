"""Expert baseline for 14p: JAX's Pallas TPU megablox gmm, which computes lax.ragged_dot.

Row tiles that straddle group boundaries are visited once per group with a store mask, and empty
groups are skipped by the group metadata; accumulation is f32, the output bf16.
"""

import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu import megablox

# gmm tiles (m, k, n) of (512, 1024, 1024), as MaxText's MoE layers pass them; capped at the shape.
TILE_M = 512
TILE_K = 1024
TILE_N = 1024


def kernel(lhs, rhs, group_sizes):
    m, k = lhs.shape
    n = rhs.shape[2]
    tiling = (min(TILE_M, m), min(TILE_K, k), min(TILE_N, n))
    return megablox.gmm(lhs, rhs, group_sizes, preferred_element_type=jnp.bfloat16, tiling=tiling)
