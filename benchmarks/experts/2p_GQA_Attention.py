"""Expert baseline for 2p: JAX's Pallas TPU flash_attention, causal, with each kv head repeated per group.

flash_attention applies the softmax scale to the f32 scores inside the kernel, which this task's
tolerance needs: splash attention (JAX's GQA kernel, which loads each kv block once per group) takes the
scale folded into a bf16 q, and that rounding alone puts it outside atol/rtol 0.02 on the evaluator's
shifted inputs (errors of 1.3-1.5 times the tolerance at the check size). Its exact alternatives cost
more than the repeat: q split into bf16 high and low parts against a doubled k (twice the QK^T passes)
or f32 operands at Precision.HIGHEST (the f32 MXU rate). The repeated k and v are written once by XLA.
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


def kernel(q, k, v):
    seq, head_dim = q.shape[-2], q.shape[-1]
    group = q.shape[1] // k.shape[1]
    major = _fit(BLOCK_K_MAJOR, seq)
    blocks = fa.BlockSizes(block_q=_fit(BLOCK_Q, seq), block_k_major=major, block_k=_fit(BLOCK_K, major),
                           block_b=BLOCK_B)
    # Query head h reads kv head h // group: consecutive query heads share one, as jnp.repeat lays out.
    k, v = jnp.repeat(k, group, axis=1), jnp.repeat(v, group, axis=1)
    return fa.flash_attention(q, k, v, causal=True, sm_scale=1.0 / math.sqrt(head_dim), block_sizes=blocks)
