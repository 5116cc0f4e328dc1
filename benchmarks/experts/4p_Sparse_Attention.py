"""Expert baseline for 4p: JAX's Pallas TPU splash attention with the task's block-sparse mask.

The mask (sliding window of key blocks, global leading blocks, causal inside blocks) is built in
numpy at trace time from the static arguments; splash turns it into block metadata and visits only
the key blocks that hold a visible entry. Batch is folded into the head axis (one kernel, no vmap).
"""

import math

import numpy as np
from jax.experimental.pallas.ops.tpu import splash_attention as splash

# Splash blocks of 512 query rows and 512 keys: each covers several of the task's mask blocks, so
# the grid stays short while fully invisible kernel blocks are still skipped.
BLOCK_Q = 512
BLOCK_KV = 512


def _visible(seq: int, block_size: int, window_blocks: int, global_blocks: int) -> np.ndarray:
    """The task's [seq, seq] boolean mask: window or global block, and causal per token."""
    pos = np.arange(seq)
    qb, kb = (pos // block_size)[:, None], (pos // block_size)[None, :]
    blocks = ((kb <= qb) & (kb > qb - window_blocks)) | (kb < global_blocks)
    return blocks & (pos[None, :] <= pos[:, None])


def kernel(q, k, v, *, block_size, window_blocks, global_blocks):
    batch, heads, seq, head_dim = q.shape
    bq, bkv = min(BLOCK_Q, seq), min(BLOCK_KV, seq)
    head_mask = splash.NumpyMask(_visible(seq, block_size, window_blocks, global_blocks))
    mask = splash.MultiHeadMask([head_mask for _ in range(batch * heads)])
    attend = splash.make_splash_mha_single_device(
        mask, block_sizes=splash.BlockSizes(block_q=bq, block_kv=bkv, block_kv_compute=bkv))
    scaled = (q * (1.0 / math.sqrt(head_dim))).astype(q.dtype)
    flat = (batch * heads, seq, head_dim)
    out = attend(scaled.reshape(flat), k.reshape(flat), v.reshape(flat))
    return out.reshape(batch, heads, seq, head_dim)
