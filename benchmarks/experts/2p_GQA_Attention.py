"""Expert baseline for 2p: JAX's Pallas TPU splash attention with its grouped-query support.

Splash's multi-head kernel takes k and v with fewer heads than q and maps query head h to kv head
h // (q_heads / kv_heads), which is the task's grouping, so each kv block is loaded once per group.
Batch is folded into the head axis (query head b*Hq + h then reads kv head b*Hkv + h // group), which
keeps that mapping and runs one kernel over every (batch, head) without a vmap.
"""

import math

from jax.experimental.pallas.ops.tpu import splash_attention as splash

# 1024-row query and key blocks (the key block computed in one piece): the largest that divide the
# full sequence while the f32 score tile stays within the default scoped VMEM.
BLOCK_Q = 1024
BLOCK_KV = 1024


def kernel(q, k, v):
    batch, q_heads, seq, head_dim = q.shape
    kv_heads = k.shape[1]
    bq, bkv = min(BLOCK_Q, seq), min(BLOCK_KV, seq)
    mask = splash.MultiHeadMask([splash.CausalMask((seq, seq)) for _ in range(batch * q_heads)])
    attend = splash.make_splash_mha_single_device(
        mask, block_sizes=splash.BlockSizes(block_q=bq, block_kv=bkv, block_kv_compute=bkv))
    # Splash takes the softmax scale folded into q.
    scaled = (q * (1.0 / math.sqrt(head_dim))).astype(q.dtype)
    out = attend(scaled.reshape(batch * q_heads, seq, head_dim),
                 k.reshape(batch * kv_heads, seq, head_dim),
                 v.reshape(batch * kv_heads, seq, head_dim))
    return out.reshape(batch, q_heads, seq, head_dim)
