"""Llama 3.1 8B decoder layer in bf16: RMSNorm, GQA attention with RoPE, RMSNorm, SwiGLU MLP, two residuals.

Activations, weights and the residual stream are bf16 as the model runs; norm statistics, RoPE, attention
scores and softmax are float32 and every matmul accumulates in float32 (``wide``). Called on float64 inputs
the same code is the float64 evaluation of the same math that the tolerance is measured against.
"""

import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, seq, hidden, heads, kv_heads, head_dim, intermediate):
    ks = jax.random.split(key, 10)

    def w(k, shape):
        return (jax.random.normal(k, shape, jnp.float32) / jnp.sqrt(shape[0])).astype(jnp.bfloat16)

    def scale(k):
        return (1.0 + 0.1 * jax.random.normal(k, (hidden,), jnp.float32)).astype(jnp.bfloat16)

    x = jax.random.normal(ks[0], (batch, seq, hidden), jnp.float32).astype(jnp.bfloat16)
    args = (x, scale(ks[1]), w(ks[2], (hidden, heads * head_dim)), w(ks[3], (hidden, kv_heads * head_dim)),
            w(ks[4], (hidden, kv_heads * head_dim)), w(ks[5], (heads * head_dim, hidden)), scale(ks[6]),
            w(ks[7], (hidden, intermediate)), w(ks[8], (hidden, intermediate)), w(ks[9], (intermediate, hidden)))
    return args, {"heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, "eps": 1e-5, "theta": 500000.0}


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
    cos, sin = jnp.cos(ang), jnp.sin(ang)
    f = x.astype(acc)
    x1, x2 = f[..., : dim // 2], f[..., dim // 2 :]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def reference(x, attn_norm, wq, wk, wv, wo, mlp_norm, w_gate, w_up, w_down, *, heads, kv_heads, head_dim, eps, theta):
    b, s, _ = x.shape
    h = rms_norm(x, attn_norm, eps)
    q = matmul(h, wq).reshape(b, s, heads, head_dim).transpose(0, 2, 1, 3)
    k = matmul(h, wk).reshape(b, s, kv_heads, head_dim).transpose(0, 2, 1, 3)
    v = matmul(h, wv).reshape(b, s, kv_heads, head_dim).transpose(0, 2, 1, 3)
    q, k = rope(q, theta), rope(k, theta)
    group = heads // kv_heads
    k, v = jnp.repeat(k, group, axis=1), jnp.repeat(v, group, axis=1)
    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k, preferred_element_type=wide(q)) / jnp.sqrt(jnp.float32(head_dim))
    causal = jnp.tril(jnp.ones((s, s), dtype=bool))
    probs = jax.nn.softmax(jnp.where(causal, scores, -jnp.inf), axis=-1).astype(q.dtype)
    attn = jnp.einsum("bhqk,bhkd->bhqd", probs, v, preferred_element_type=wide(q)).astype(q.dtype)
    x = x + matmul(attn.transpose(0, 2, 1, 3).reshape(b, s, heads * head_dim), wo)
    h = rms_norm(x, mlp_norm, eps)
    return x + matmul(jax.nn.silu(matmul(h, w_gate)) * matmul(h, w_up), w_down)
