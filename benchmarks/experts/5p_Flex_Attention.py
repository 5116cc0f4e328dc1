"""Expert baseline for 5p: JAX's Pallas TPU flash_attention, causal, with the bias passed as `ab`.

flash_attention has no score-modification hook, so the relative-position bias is gathered from the
table into a dense [batch, heads, seq, seq] bf16 array (exact: the table is bf16) and added by the
kernel to each score block in f32. The kernel adds `ab` before it applies sm_scale, so the kernel runs
with sm_scale 1 and the scale goes into q. Rounding the scaled q to bf16 puts the kernel outside this
task's atol/rtol 0.02 on the evaluator's shifted inputs (up to 1.5 times the tolerance at the check
size), and so does a bf16 `ab` pre-multiplied by sqrt(head_dim) with the scale left in the kernel (0.89
times the tolerance: a pass or a fail by the draw). So the scaled q is computed in f32 and split into
bf16 high and low parts side by side on the head axis, against k repeated likewise and v padded with
zeros (flash_attention takes one head size for q, k and v): twice the MXU passes, bf16 operands, f32
accumulation. The f32 alternative (an f32 `ab` pre-multiplied by sqrt(head_dim)) doubles the bias
traffic, which bounds this kernel, and is modelled slower.
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


def _side_by_side(first, second):
    """Two arrays of one shape laid side by side on the last axis."""
    return jnp.stack([first, second], axis=-2).reshape(first.shape[:-1] + (2 * first.shape[-1],))


def kernel(q, k, v, bias_table):
    batch, heads, seq, head_dim = q.shape
    num_buckets = bias_table.shape[-1]
    rel = jnp.arange(seq)[:, None] - jnp.arange(seq)[None, :]
    bucket = jnp.clip(rel, 0, num_buckets - 1)
    # One copy of the gathered bias per batch row, written once (a broadcast of the gather would
    # first write the [heads, seq, seq] gather and then read it again).
    ab = jnp.stack([bias_table[:, bucket]] * batch)
    major = _fit(BLOCK_K_MAJOR, seq)
    blocks = fa.BlockSizes(block_q=_fit(BLOCK_Q, seq), block_k_major=major, block_k=_fit(BLOCK_K, major),
                           block_b=BLOCK_B)
    scaled = q.astype(jnp.float32) * (1.0 / math.sqrt(head_dim))
    high = scaled.astype(jnp.bfloat16)
    low = (scaled - high.astype(jnp.float32)).astype(jnp.bfloat16)
    out = fa.flash_attention(_side_by_side(high, low), _side_by_side(k, k), _side_by_side(v, jnp.zeros_like(v)),
                             ab=ab, causal=True, sm_scale=1.0, block_sizes=blocks)
    return out[..., :head_dim]
