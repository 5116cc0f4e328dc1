"""Expert baseline for 8p: the Pallas TPU matmul JAX ships (the kernel of its TPU matmul guide).

bf16 operands, an f32 VMEM accumulator over the k axis, one bf16 store per output tile.
"""

import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu import matmul as mm

# The guide's best bf16 blocks on v5e: 512 rows, 1024 columns, 1024 along k.
BLOCK_M = 512
BLOCK_N = 1024
BLOCK_K = 1024


def kernel(a, b):
    m, k = a.shape
    n = b.shape[1]
    # The kernel needs its row block to divide the rows: a user pads a row count it does not divide with
    # zero rows and drops their outputs (at the task's sizes the blocks divide and nothing is padded).
    block_m = min(BLOCK_M, m)
    rows = -(-m // block_m) * block_m
    padded = a if rows == m else jnp.pad(a, ((0, rows - m), (0, 0)))
    out = mm.matmul(padded, b, block_shape=(block_m, min(BLOCK_N, n)), block_k=min(BLOCK_K, k))
    return out if rows == m else out[:m]
