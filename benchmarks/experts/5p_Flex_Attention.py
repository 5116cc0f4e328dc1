"""Expert baseline for 5p: JAX's Pallas TPU flash_attention, causal, with the bias passed as `ab`.

flash_attention has no score-modification hook, so the relative-position bias is gathered from the
table into a dense [batch, heads, seq, seq] bf16 array (exact: the table is bf16) and added by the
kernel to each score block in f32. The kernel adds `ab` before it applies sm_scale, so the scale is
folded into q instead and the kernel runs with sm_scale 1.
"""

import math

import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu import flash_attention as fa

# The blocks of the plain causal task: 1024 query rows, 1024 keys a major block, 512-key steps.
BLOCK_Q = 1024
BLOCK_K_MAJOR = 1024
BLOCK_K = 512
BLOCK_B = 1
LANES = 128


def _fit(cap: int, length: int) -> int:
    """The largest multiple of 128 up to ``cap`` that divides ``length`` (else ``length`` itself)."""
    return next((b for b in range(min(cap, length), 0, -LANES) if length % b == 0 and b % LANES == 0), length)


def kernel(q, k, v, bias_table):
    batch, heads, seq, head_dim = q.shape
    num_buckets = bias_table.shape[-1]
    rel = jnp.arange(seq)[:, None] - jnp.arange(seq)[None, :]
    bucket = jnp.clip(rel, 0, num_buckets - 1)
    ab = jnp.broadcast_to(bias_table[:, bucket][None], (batch, heads, seq, seq))
    major = _fit(BLOCK_K_MAJOR, seq)
    blocks = fa.BlockSizes(block_q=_fit(BLOCK_Q, seq), block_k_major=major, block_k=_fit(BLOCK_K, major),
                           block_b=BLOCK_B)
    scaled = (q * (1.0 / math.sqrt(head_dim))).astype(q.dtype)
    return fa.flash_attention(scaled, k, v, ab=ab, causal=True, sm_scale=1.0, block_sizes=blocks)
