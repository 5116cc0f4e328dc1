"""Llama 3.1 8B decoder layer: RMSNorm, GQA attention with RoPE, RMSNorm, SwiGLU MLP, two residuals."""

import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, seq, hidden, heads, kv_heads, head_dim, intermediate):
    ks = jax.random.split(key, 10)

    def w(k, shape):
        return jax.random.normal(k, shape, jnp.float32) / jnp.sqrt(shape[0])

    x = jax.random.normal(ks[0], (batch, seq, hidden), jnp.float32)
    args = (x, 1.0 + 0.1 * jax.random.normal(ks[1], (hidden,), jnp.float32),
            w(ks[2], (hidden, heads * head_dim)), w(ks[3], (hidden, kv_heads * head_dim)),
            w(ks[4], (hidden, kv_heads * head_dim)), w(ks[5], (heads * head_dim, hidden)),
            1.0 + 0.1 * jax.random.normal(ks[6], (hidden,), jnp.float32),
            w(ks[7], (hidden, intermediate)), w(ks[8], (hidden, intermediate)), w(ks[9], (intermediate, hidden)))
    return args, {"heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, "eps": 1e-5, "theta": 500000.0}


def rms_norm(x, weight, eps):
    return x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + eps) * weight


def rope(x, theta):
    seq, dim = x.shape[-2], x.shape[-1]
    inv = 1.0 / (theta ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
    ang = jnp.arange(seq, dtype=jnp.float32)[:, None] * inv[None, :]
    cos, sin = jnp.cos(ang), jnp.sin(ang)
    x1, x2 = x[..., : dim // 2], x[..., dim // 2 :]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def reference(x, attn_norm, wq, wk, wv, wo, mlp_norm, w_gate, w_up, w_down, *, heads, kv_heads, head_dim, eps, theta):
    b, s, _ = x.shape
    h = rms_norm(x, attn_norm, eps)
    q = (h @ wq).reshape(b, s, heads, head_dim).transpose(0, 2, 1, 3)
    k = (h @ wk).reshape(b, s, kv_heads, head_dim).transpose(0, 2, 1, 3)
    v = (h @ wv).reshape(b, s, kv_heads, head_dim).transpose(0, 2, 1, 3)
    q, k = rope(q, theta), rope(k, theta)
    group = heads // kv_heads
    k, v = jnp.repeat(k, group, axis=1), jnp.repeat(v, group, axis=1)
    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k) / jnp.sqrt(jnp.float32(head_dim))
    causal = jnp.tril(jnp.ones((s, s), dtype=bool))
    probs = jax.nn.softmax(jnp.where(causal, scores, -jnp.inf), axis=-1)
    attn = jnp.einsum("bhqk,bhkd->bhqd", probs, v).transpose(0, 2, 1, 3).reshape(b, s, heads * head_dim)
    x = x + attn @ wo
    h = rms_norm(x, mlp_norm, eps)
    return x + (jax.nn.silu(h @ w_gate) * (h @ w_up)) @ w_down
