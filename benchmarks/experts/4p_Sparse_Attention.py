"""Expert baseline for 4p: JAX's Pallas TPU splash attention with the task's block-sparse mask.

The mask (sliding window of key blocks, global leading blocks, causal inside blocks) is built in
numpy at trace time from the static arguments; splash turns it into block metadata and visits only
the key blocks that hold a visible entry. Batch is folded into the head axis (one kernel, no vmap).

Splash has no softmax-scale argument: it takes the scale folded into q. Rounding the scaled q to bf16
puts it outside this task's atol/rtol 0.02 on the evaluator's shifted inputs (up to 1.4 times the
tolerance at the check size), so the scaled q is computed in f32 and split into bf16 high and low
parts, laid side by side along the head axis against k repeated likewise: the kernel's one QK^T over
the doubled head axis then sums q_hi.k + q_lo.k with bf16 operands and f32 accumulation (about 16 bits
of q kept), at twice the QK^T passes. f32 operands at Precision.HIGHEST would run at the f32 MXU rate.
"""

import math

import jax.numpy as jnp
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


def _split_scaled(q, scale: float):
    """q * scale as bf16 high and low parts side by side on the last axis (the sum keeps ~16 bits)."""
    scaled = q.astype(jnp.float32) * scale
    high = scaled.astype(jnp.bfloat16)
    low = (scaled - high.astype(jnp.float32)).astype(jnp.bfloat16)
    return jnp.stack([high, low], axis=-2).reshape(q.shape[:-1] + (2 * q.shape[-1],))


def _block(largest: int, seq: int) -> int:
    """The largest block up to ``largest``, halved down to 128, that divides ``seq`` (splash needs its blocks to
    divide the sequence): what a user of the kernel picks at a sequence the tuned 512 does not divide."""
    block = min(largest, seq)
    while seq % block and block > 128:
        block //= 2
    return block


def kernel(q, k, v, *, block_size, window_blocks, global_blocks):
    batch, heads, seq, head_dim = q.shape
    bq, bkv = _block(BLOCK_Q, seq), _block(BLOCK_KV, seq)
    head_mask = splash.NumpyMask(_visible(seq, block_size, window_blocks, global_blocks))
    mask = splash.MultiHeadMask([head_mask for _ in range(batch * heads)])
    attend = splash.make_splash_mha_single_device(
        mask, block_sizes=splash.BlockSizes(block_q=bq, block_kv=bkv, block_kv_compute=bkv))
    wide = (batch * heads, seq, 2 * head_dim)
    q_parts = _split_scaled(q, 1.0 / math.sqrt(head_dim)).reshape(wide)
    k_twice = jnp.stack([k, k], axis=-2).reshape(wide)
    out = attend(q_parts, k_twice, v.reshape(batch * heads, seq, head_dim))
    return out.reshape(batch, heads, seq, head_dim)
