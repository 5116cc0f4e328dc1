"""Expert baseline for 3p: the MLA layer's projections in XLA around JAX's Pallas TPU splash attention.

Projections, RMSNorm and RoPE are plain JAX in f32, as the task asks ("compute in float32"; bf16
operands or a bf16 q/k/v for the kernel fail its tolerance on the shifted inputs). Every matmul, the
kernel's too, runs at Precision.HIGHEST: at the default precision a TPU multiplies f32 operands in one
bf16 pass, which is the bf16 rounding the tolerance does not admit; HIGHEST is priced at the f32 rate.
Attention is splash's multi-head kernel, which allows a value head size (v_head_dim) different from the
query/key one (nope + rope): the shared RoPE key is broadcast to every head and appended to k_nope, and
q_nope | q_pe likewise, so one kernel scores both parts at once.
"""

import math

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu import splash_attention as splash

# 512-row query and key blocks: the score tile stays small beside the 192-wide q/k tiles.
BLOCK_Q = 512
BLOCK_KV = 512
F32 = jnp.float32


def _rms_norm(t, weight, eps):
    return t * jax.lax.rsqrt(jnp.mean(jnp.square(t), axis=-1, keepdims=True) + eps) * weight.astype(F32)


def _rope(t, theta):
    """Interleaved-pair rotation of t [batch, seq, heads, dim] by position * theta**(-2i/dim)."""
    seq, dim = t.shape[1], t.shape[-1]
    inv_freq = theta ** (-jnp.arange(0, dim, 2, dtype=F32) / dim)
    ang = jnp.arange(seq, dtype=F32)[:, None] * inv_freq[None, :]
    cos, sin = jnp.cos(ang)[None, :, None, :], jnp.sin(ang)[None, :, None, :]
    pairs = t.reshape(t.shape[:-1] + (dim // 2, 2))
    a, b = pairs[..., 0], pairs[..., 1]
    return jnp.stack([a * cos - b * sin, a * sin + b * cos], axis=-1).reshape(t.shape)


def _mm(x, w):
    return jnp.dot(x.astype(F32), w.astype(F32))


def kernel(x, wq_a, q_norm, wq_b, wkv_a, kv_norm, wkv_b, wo, **static):
    with jax.default_matmul_precision("highest"):
        return _layer(x, wq_a, q_norm, wq_b, wkv_a, kv_norm, wkv_b, wo, **static)


def _layer(x, wq_a, q_norm, wq_b, wkv_a, kv_norm, wkv_b, wo, *, num_heads, qk_nope_head_dim,
           qk_rope_head_dim, v_head_dim, rope_theta, eps):
    batch, seq, _ = x.shape
    h, nope, rope, dv = num_heads, qk_nope_head_dim, qk_rope_head_dim, v_head_dim
    kv_lora = kv_norm.shape[0]
    q = _mm(_rms_norm(_mm(x, wq_a), q_norm, eps), wq_b).reshape(batch, seq, h, nope + rope)
    kv_a = _mm(x, wkv_a)
    kv = _mm(_rms_norm(kv_a[..., :kv_lora], kv_norm, eps), wkv_b).reshape(batch, seq, h, nope + dv)
    q_pe = _rope(q[..., nope:], rope_theta)
    k_pe = _rope(kv_a[..., kv_lora:].reshape(batch, seq, 1, rope), rope_theta)
    scale = 1.0 / math.sqrt(nope + rope)
    q_full = jnp.concatenate([q[..., :nope], q_pe], axis=-1) * scale
    k_full = jnp.concatenate([kv[..., :nope], jnp.broadcast_to(k_pe, (batch, seq, h, rope))], axis=-1)

    def heads_major(t):  # [batch, seq, heads, d] -> [batch * heads, seq, d]
        return t.transpose(0, 2, 1, 3).reshape(batch * h, seq, t.shape[-1])

    mask = splash.MultiHeadMask([splash.CausalMask((seq, seq)) for _ in range(batch * h)])
    bq, bkv = min(BLOCK_Q, seq), min(BLOCK_KV, seq)
    attend = splash.make_splash_mha_single_device(
        mask, block_sizes=splash.BlockSizes(block_q=bq, block_kv=bkv, block_kv_compute=bkv))
    o = attend(heads_major(q_full), heads_major(k_full), heads_major(kv[..., nope:]))
    o = o.reshape(batch, h, seq, dv).transpose(0, 2, 1, 3).reshape(batch, seq, h * dv)
    return _mm(o, wo).astype(jnp.bfloat16)
