"""DeepSeek-V3 style multi-head latent attention (MLA) layer, causal, with weights as inputs.

Queries and keys/values go through low-rank latents (RMS-normalized), the per-head query/key
vectors are split into a "nope" part and a RoPE part, and the RoPE key is a single vector shared
by all heads. Output is projected back to the hidden size.
"""

import math

import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, seq, hidden, num_heads, q_lora_rank, kv_lora_rank,
               qk_nope_head_dim, qk_rope_head_dim, v_head_dim):
    ks = jax.random.split(key, 8)
    qk_head = qk_nope_head_dim + qk_rope_head_dim

    def w(k, fan_in, fan_out, gain=1.0):
        return (gain / math.sqrt(fan_in) * jax.random.normal(k, (fan_in, fan_out), jnp.float32)).astype(jnp.bfloat16)

    def norm_w(k, n):
        return (1.0 + 0.1 * jax.random.normal(k, (n,), jnp.float32)).astype(jnp.bfloat16)

    x = jax.random.normal(ks[0], (batch, seq, hidden), jnp.float32).astype(jnp.bfloat16)
    wq_a = w(ks[1], hidden, q_lora_rank)
    q_norm = norm_w(ks[2], q_lora_rank)
    wq_b = w(ks[3], q_lora_rank, num_heads * qk_head, gain=1.4)
    wkv_a = w(ks[4], hidden, kv_lora_rank + qk_rope_head_dim, gain=1.4)
    kv_norm = norm_w(ks[5], kv_lora_rank)
    wkv_b = w(ks[6], kv_lora_rank, num_heads * (qk_nope_head_dim + v_head_dim), gain=1.4)
    wo = w(ks[7], num_heads * v_head_dim, hidden, gain=2.0)
    static = {
        "num_heads": num_heads,
        "qk_nope_head_dim": qk_nope_head_dim,
        "qk_rope_head_dim": qk_rope_head_dim,
        "v_head_dim": v_head_dim,
        "rope_theta": 10000.0,
        "eps": 1e-6,
    }
    return (x, wq_a, q_norm, wq_b, wkv_a, kv_norm, wkv_b, wo), static


def _rms_norm(t, weight, eps):
    ms = jnp.mean(jnp.square(t), axis=-1, keepdims=True)
    return t * jax.lax.rsqrt(ms + eps) * weight


def _rope_interleaved(t, positions, theta):
    """Rotate adjacent pairs (t[2i], t[2i+1]) by angle position * theta**(-2i/dim)."""
    dim = t.shape[-1]
    inv_freq = theta ** (-jnp.arange(0, dim, 2, dtype=jnp.float32) / dim)
    ang = positions[:, None].astype(jnp.float32) * inv_freq[None, :]  # [seq, dim/2]
    cos = jnp.cos(ang)[None, :, None, :]
    sin = jnp.sin(ang)[None, :, None, :]
    pairs = t.reshape(t.shape[:-1] + (dim // 2, 2))
    a, b = pairs[..., 0], pairs[..., 1]
    rotated = jnp.stack([a * cos - b * sin, a * sin + b * cos], axis=-1)
    return rotated.reshape(t.shape)


def reference(x, wq_a, q_norm, wq_b, wkv_a, kv_norm, wkv_b, wo, *, num_heads, qk_nope_head_dim,
              qk_rope_head_dim, v_head_dim, rope_theta, eps):
    f32 = jnp.float32
    batch, seq, _ = x.shape
    nope, rope, dv, h = qk_nope_head_dim, qk_rope_head_dim, v_head_dim, num_heads
    kv_lora = kv_norm.shape[0]
    xf = x.astype(f32)

    # Query path: hidden -> q_lora (RMSNorm) -> heads * (nope + rope).
    cq = _rms_norm(xf @ wq_a.astype(f32), q_norm.astype(f32), eps)
    q = (cq @ wq_b.astype(f32)).reshape(batch, seq, h, nope + rope)
    q_nope, q_pe = q[..., :nope], q[..., nope:]

    # Key/value path: hidden -> [kv_lora latent | shared rope key]; latent -> heads * (nope + v).
    kv_a = xf @ wkv_a.astype(f32)
    c_kv = _rms_norm(kv_a[..., :kv_lora], kv_norm.astype(f32), eps)
    k_pe = kv_a[..., kv_lora:].reshape(batch, seq, 1, rope)
    kv = (c_kv @ wkv_b.astype(f32)).reshape(batch, seq, h, nope + dv)
    k_nope, v = kv[..., :nope], kv[..., nope:]

    positions = jnp.arange(seq)
    q_pe = _rope_interleaved(q_pe, positions, rope_theta)
    k_pe = _rope_interleaved(k_pe, positions, rope_theta)

    scale = 1.0 / math.sqrt(nope + rope)
    scores = (jnp.einsum("bqhd,bkhd->bhqk", q_nope, k_nope)
              + jnp.einsum("bqhd,bkd->bhqk", q_pe, k_pe[:, :, 0, :])) * scale
    causal = jnp.arange(seq)[None, :] <= jnp.arange(seq)[:, None]
    scores = jnp.where(causal, scores, -jnp.inf)
    m = jnp.max(scores, axis=-1, keepdims=True)
    p = jnp.exp(scores - m)
    p = p / jnp.sum(p, axis=-1, keepdims=True)
    attn = jnp.einsum("bhqk,bkhd->bqhd", p, v).reshape(batch, seq, h * dv)
    return (attn @ wo.astype(f32)).astype(jnp.bfloat16)
