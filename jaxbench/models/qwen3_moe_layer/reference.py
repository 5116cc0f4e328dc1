"""Qwen3 MoE decoder layer: GQA attention with per-head q/k RMSNorm and RoPE, then a top-k MoE."""

import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, seq, hidden, heads, kv_heads, head_dim, experts, intermediate, top_k):
    ks = jax.random.split(key, 13)

    def w(k, shape):
        return jax.random.normal(k, shape, jnp.float32) / jnp.sqrt(shape[-2])

    def scale(k, n):
        return 1.0 + 0.1 * jax.random.normal(k, (n,), jnp.float32)

    x = jax.random.normal(ks[0], (batch, seq, hidden), jnp.float32)
    args = (x, scale(ks[1], hidden), w(ks[2], (hidden, heads * head_dim)), w(ks[3], (hidden, kv_heads * head_dim)),
            w(ks[4], (hidden, kv_heads * head_dim)), scale(ks[5], head_dim), scale(ks[6], head_dim),
            w(ks[7], (heads * head_dim, hidden)), scale(ks[8], hidden), w(ks[9], (hidden, experts)),
            w(ks[10], (experts, hidden, intermediate)), w(ks[11], (experts, hidden, intermediate)),
            w(ks[12], (experts, intermediate, hidden)))
    return args, {"heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, "top_k": top_k, "eps": 1e-6,
                  "theta": 1000000.0}


def rms_norm(x, weight, eps):
    return x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + eps) * weight


def rope(x, theta):
    seq, dim = x.shape[-2], x.shape[-1]
    inv = 1.0 / (theta ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
    ang = jnp.arange(seq, dtype=jnp.float32)[:, None] * inv[None, :]
    x1, x2 = x[..., : dim // 2], x[..., dim // 2 :]
    return jnp.concatenate([x1 * jnp.cos(ang) - x2 * jnp.sin(ang), x2 * jnp.cos(ang) + x1 * jnp.sin(ang)], axis=-1)


def reference(x, attn_norm, wq, wk, wv, q_norm, k_norm, wo, mlp_norm, router, w_gate, w_up, w_down, *, heads,
              kv_heads, head_dim, top_k, eps, theta):
    b, s, d = x.shape
    h = rms_norm(x, attn_norm, eps)
    q = rms_norm((h @ wq).reshape(b, s, heads, head_dim), q_norm, eps).transpose(0, 2, 1, 3)
    k = rms_norm((h @ wk).reshape(b, s, kv_heads, head_dim), k_norm, eps).transpose(0, 2, 1, 3)
    v = (h @ wv).reshape(b, s, kv_heads, head_dim).transpose(0, 2, 1, 3)
    q, k = rope(q, theta), rope(k, theta)
    k, v = jnp.repeat(k, heads // kv_heads, axis=1), jnp.repeat(v, heads // kv_heads, axis=1)
    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k) / jnp.sqrt(jnp.float32(head_dim))
    scores = jnp.where(jnp.tril(jnp.ones((s, s), dtype=bool)), scores, -jnp.inf)
    attn = jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(scores, axis=-1), v)
    x = x + attn.transpose(0, 2, 1, 3).reshape(b, s, heads * head_dim) @ wo
    h = rms_norm(x, mlp_norm, eps).reshape(b * s, d)
    probs = jax.nn.softmax(h @ router, axis=-1)
    top_vals, top_idx = jax.lax.top_k(probs, top_k)
    top_vals = top_vals / jnp.sum(top_vals, axis=-1, keepdims=True)
    gates = jnp.sum(jax.nn.one_hot(top_idx, router.shape[1], dtype=h.dtype) * top_vals[..., None], axis=1)
    act = jax.nn.silu(jnp.einsum("td,edf->etf", h, w_gate)) * jnp.einsum("td,edf->etf", h, w_up)
    moe = jnp.einsum("etd,te->td", jnp.einsum("etf,efd->etd", act, w_down), gates)
    return x + moe.reshape(b, s, d)
