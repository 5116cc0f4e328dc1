"""Expert baseline for 8p: the Pallas TPU matmul JAX ships (the kernel of its TPU matmul guide).

bf16 operands, an f32 VMEM accumulator over the k axis, one bf16 store per output tile.
"""

from jax.experimental.pallas.ops.tpu import matmul as mm

# The guide's best bf16 blocks on v5e: 512 rows, 1024 columns, 1024 along k.
BLOCK_M = 512
BLOCK_N = 1024
BLOCK_K = 1024


def kernel(a, b):
    m, k = a.shape
    n = b.shape[1]
    return mm.matmul(a, b, block_shape=(min(BLOCK_M, m), min(BLOCK_N, n)), block_k=min(BLOCK_K, k))
