"""Expert baseline for 11p: JAX's Pallas TPU megablox gmm (group metadata by scalar prefetch).

The task's operands are gmm's own (lhs [m, k], rhs [groups, k, n], int32 group sizes); gmm
accumulates in an f32 VMEM tile and stores in the requested bf16.
"""

import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu import megablox

# gmm tiles (m, k, n) of (512, 1024, 1024), as MaxText's MoE layers pass them; capped at the shape.
TILE_M = 512
TILE_K = 1024
TILE_N = 1024


def kernel(lhs, group_sizes, rhs):
    m, k = lhs.shape
    n = rhs.shape[2]
    tiling = (min(TILE_M, m), min(TILE_K, k), min(TILE_N, n))
    return megablox.gmm(lhs, rhs, group_sizes, preferred_element_type=jnp.bfloat16, tiling=tiling)
