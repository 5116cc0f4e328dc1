"""Gemma 2 9B decoder layer (a local one) in bf16: sliding-window attention with logit soft-capping, GeGLU,
four norms.

Activations, weights and the residual stream are bf16 as the model runs; the norms run in float32 and scale
by (1 + w) before casting back (as Gemma's RMSNorm does), RoPE, attention scores, soft-capping and softmax
are float32, and every matmul accumulates in float32 (``wide``). Called on float64 inputs the same code is
the float64 evaluation of the same math that the tolerance is measured against.
"""

import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, seq, hidden, heads, kv_heads, head_dim, intermediate, window):
    ks = jax.random.split(key, 12)

    def w(k, shape):
        return jax.random.normal(k, shape, jnp.float32) / jnp.sqrt(shape[0])

    def scale(k):
        return 0.1 * jax.random.normal(k, (hidden,), jnp.float32)

    x = jax.random.normal(ks[0], (batch, seq, hidden), jnp.float32)
    args = (x, scale(ks[1]), w(ks[2], (hidden, heads * head_dim)), w(ks[3], (hidden, kv_heads * head_dim)),
            w(ks[4], (hidden, kv_heads * head_dim)), w(ks[5], (heads * head_dim, hidden)), scale(ks[6]),
            scale(ks[7]), w(ks[8], (hidden, intermediate)), w(ks[9], (hidden, intermediate)),
            w(ks[10], (intermediate, hidden)), scale(ks[11]))
    return tuple(a.astype(jnp.bfloat16) for a in args), {"heads": heads, "kv_heads": kv_heads, "head_dim": head_dim,
                                                         "window": window, "softcap": 50.0, "eps": 1e-6,
                                                         "theta": 10000.0}


def wide(x):
    return jnp.promote_types(x.dtype, jnp.float32)


def matmul(a, b):
    return jnp.matmul(a, b, preferred_element_type=wide(a)).astype(a.dtype)


def rms_norm(x, weight, eps):
    f = x.astype(wide(x))
    normed = f * jax.lax.rsqrt(jnp.mean(jnp.square(f), axis=-1, keepdims=True) + eps)
    return (normed * (1.0 + weight.astype(f.dtype))).astype(x.dtype)


def rope(x, theta):
    seq, dim, acc = x.shape[-2], x.shape[-1], wide(x)
    inv = 1.0 / (theta ** (jnp.arange(0, dim, 2, dtype=acc) / dim))
    ang = jnp.arange(seq, dtype=acc)[:, None] * inv[None, :]
    f = x.astype(acc)
    x1, x2 = f[..., : dim // 2], f[..., dim // 2 :]
    rotated = [x1 * jnp.cos(ang) - x2 * jnp.sin(ang), x2 * jnp.cos(ang) + x1 * jnp.sin(ang)]
    return jnp.concatenate(rotated, axis=-1).astype(x.dtype)


def reference(x, pre_attn, wq, wk, wv, wo, post_attn, pre_mlp, w_gate, w_up, w_down, post_mlp, *, heads, kv_heads,
              head_dim, window, softcap, eps, theta):
    b, s, _ = x.shape
    h = rms_norm(x, pre_attn, eps)
    q = rope(matmul(h, wq).reshape(b, s, heads, head_dim).transpose(0, 2, 1, 3), theta)
    k = rope(matmul(h, wk).reshape(b, s, kv_heads, head_dim).transpose(0, 2, 1, 3), theta)
    v = matmul(h, wv).reshape(b, s, kv_heads, head_dim).transpose(0, 2, 1, 3)
    k, v = jnp.repeat(k, heads // kv_heads, axis=1), jnp.repeat(v, heads // kv_heads, axis=1)
    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k, preferred_element_type=wide(q)) / jnp.sqrt(jnp.float32(head_dim))
    scores = softcap * jnp.tanh(scores / softcap)
    pos = jnp.arange(s)
    visible = (pos[None, :] <= pos[:, None]) & (pos[:, None] - pos[None, :] < window)
    probs = jax.nn.softmax(jnp.where(visible, scores, -jnp.inf), axis=-1).astype(q.dtype)
    attn = jnp.einsum("bhqk,bhkd->bhqd", probs, v, preferred_element_type=wide(q)).astype(q.dtype)
    x = x + rms_norm(matmul(attn.transpose(0, 2, 1, 3).reshape(b, s, heads * head_dim), wo), post_attn, eps)
    h = rms_norm(x, pre_mlp, eps)
    mlp = matmul(jax.nn.gelu(matmul(h, w_gate), approximate=True) * matmul(h, w_up), w_down)
    return x + rms_norm(mlp, post_mlp, eps)
