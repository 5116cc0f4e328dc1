"""Qwen3 MoE decoder layer in bf16: GQA attention with per-head q/k RMSNorm and RoPE, then a top-k MoE.

Activations, weights and the residual stream are bf16 as the model runs; norm statistics, RoPE, attention
scores and softmax, and the router's softmax and top-k are float32 (the HF implementation's router softmax
runs in float32), and every matmul accumulates in float32 (``wide``). Each token of ``x`` leans towards
``top_k`` experts drawn for it, so the router's top-k margin is far above bf16 rounding and the choice never
flips between numerics. Called on float64 inputs the same code is the float64 evaluation of the same math
that the tolerance is measured against.
"""

import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, seq, hidden, heads, kv_heads, head_dim, experts, intermediate, top_k):
    ks = jax.random.split(key, 14)

    def w(k, shape):
        return jax.random.normal(k, shape, jnp.float32) / jnp.sqrt(shape[-2])

    def scale(k, n):
        return 1.0 + 0.1 * jax.random.normal(k, (n,), jnp.float32)

    router = w(ks[9], (hidden, experts))
    x = jax.random.normal(ks[0], (batch, seq, hidden), jnp.float32) + leaning(ks[13], router, (batch, seq), top_k)
    args = (x, scale(ks[1], hidden), w(ks[2], (hidden, heads * head_dim)), w(ks[3], (hidden, kv_heads * head_dim)),
            w(ks[4], (hidden, kv_heads * head_dim)), scale(ks[5], head_dim), scale(ks[6], head_dim),
            w(ks[7], (heads * head_dim, hidden)), scale(ks[8], hidden), router,
            w(ks[10], (experts, hidden, intermediate)), w(ks[11], (experts, hidden, intermediate)),
            w(ks[12], (experts, intermediate, hidden)))
    return tuple(a.astype(jnp.bfloat16) for a in args), {"heads": heads, "kv_heads": kv_heads, "head_dim": head_dim,
                                                         "top_k": top_k, "eps": 1e-6, "theta": 1000000.0}


def leaning(key, router, tokens, top_k, strength=12.0):
    """A push along the router columns of ``top_k`` experts drawn per token (columns of norm about one)."""
    draw = jax.random.uniform(key, tokens + (router.shape[1],))
    picked = (draw >= jnp.sort(draw, axis=-1)[..., -top_k:-top_k + 1]).astype(jnp.float32)
    return strength * picked @ router.T


def wide(x):
    return jnp.promote_types(x.dtype, jnp.float32)


def matmul(a, b):
    return jnp.matmul(a, b, preferred_element_type=wide(a)).astype(a.dtype)


def rms_norm(x, weight, eps):
    f = x.astype(wide(x))
    return weight * (f * jax.lax.rsqrt(jnp.mean(jnp.square(f), axis=-1, keepdims=True) + eps)).astype(x.dtype)


def rope(x, theta):
    seq, dim, acc = x.shape[-2], x.shape[-1], wide(x)
    inv = 1.0 / (theta ** (jnp.arange(0, dim, 2, dtype=acc) / dim))
    ang = jnp.arange(seq, dtype=acc)[:, None] * inv[None, :]
    f = x.astype(acc)
    x1, x2 = f[..., : dim // 2], f[..., dim // 2 :]
    rotated = [x1 * jnp.cos(ang) - x2 * jnp.sin(ang), x2 * jnp.cos(ang) + x1 * jnp.sin(ang)]
    return jnp.concatenate(rotated, axis=-1).astype(x.dtype)


def reference(x, attn_norm, wq, wk, wv, q_norm, k_norm, wo, mlp_norm, router, w_gate, w_up, w_down, *, heads,
              kv_heads, head_dim, top_k, eps, theta):
    b, s, d = x.shape
    h = rms_norm(x, attn_norm, eps)
    q = rms_norm(matmul(h, wq).reshape(b, s, heads, head_dim), q_norm, eps).transpose(0, 2, 1, 3)
    k = rms_norm(matmul(h, wk).reshape(b, s, kv_heads, head_dim), k_norm, eps).transpose(0, 2, 1, 3)
    v = matmul(h, wv).reshape(b, s, kv_heads, head_dim).transpose(0, 2, 1, 3)
    q, k = rope(q, theta), rope(k, theta)
    k, v = jnp.repeat(k, heads // kv_heads, axis=1), jnp.repeat(v, heads // kv_heads, axis=1)
    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k, preferred_element_type=wide(q)) / jnp.sqrt(jnp.float32(head_dim))
    scores = jnp.where(jnp.tril(jnp.ones((s, s), dtype=bool)), scores, -jnp.inf)
    probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
    attn = jnp.einsum("bhqk,bhkd->bhqd", probs, v, preferred_element_type=wide(q)).astype(q.dtype)
    x = x + matmul(attn.transpose(0, 2, 1, 3).reshape(b, s, heads * head_dim), wo)
    h = rms_norm(x, mlp_norm, eps).reshape(b * s, d)
    probs = jax.nn.softmax(jnp.matmul(h, router, preferred_element_type=wide(h)), axis=-1)
    top_vals, top_idx = jax.lax.top_k(probs, top_k)
    top_vals = top_vals / jnp.sum(top_vals, axis=-1, keepdims=True)
    gates = jnp.sum(jax.nn.one_hot(top_idx, router.shape[1], dtype=top_vals.dtype) * top_vals[..., None], axis=1)
    gate = jnp.einsum("td,edf->etf", h, w_gate)
    up = jnp.einsum("td,edf->etf", h, w_up)
    out = jnp.einsum("etf,efd->etd", jax.nn.silu(gate) * up, w_down)
    moe = jnp.einsum("etd,te->td", out, gates.astype(h.dtype), preferred_element_type=wide(h)).astype(h.dtype)
    return x + moe.reshape(b, s, d)
