"""Gemma 2 9B decoder layer (a local one): sliding-window attention with logit soft-capping, GeGLU, four norms."""

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
    return args, {"heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, "window": window, "softcap": 50.0,
                  "eps": 1e-6, "theta": 10000.0}


def rms_norm(x, weight, eps):
    return x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + eps) * (1.0 + weight)


def rope(x, theta):
    seq, dim = x.shape[-2], x.shape[-1]
    inv = 1.0 / (theta ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
    ang = jnp.arange(seq, dtype=jnp.float32)[:, None] * inv[None, :]
    x1, x2 = x[..., : dim // 2], x[..., dim // 2 :]
    return jnp.concatenate([x1 * jnp.cos(ang) - x2 * jnp.sin(ang), x2 * jnp.cos(ang) + x1 * jnp.sin(ang)], axis=-1)


def reference(x, pre_attn, wq, wk, wv, wo, post_attn, pre_mlp, w_gate, w_up, w_down, post_mlp, *, heads, kv_heads,
              head_dim, window, softcap, eps, theta):
    b, s, _ = x.shape
    h = rms_norm(x, pre_attn, eps)
    q = rope((h @ wq).reshape(b, s, heads, head_dim).transpose(0, 2, 1, 3), theta)
    k = rope((h @ wk).reshape(b, s, kv_heads, head_dim).transpose(0, 2, 1, 3), theta)
    v = (h @ wv).reshape(b, s, kv_heads, head_dim).transpose(0, 2, 1, 3)
    k, v = jnp.repeat(k, heads // kv_heads, axis=1), jnp.repeat(v, heads // kv_heads, axis=1)
    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k) / jnp.sqrt(jnp.float32(head_dim))
    scores = softcap * jnp.tanh(scores / softcap)
    pos = jnp.arange(s)
    visible = (pos[None, :] <= pos[:, None]) & (pos[:, None] - pos[None, :] < window)
    probs = jax.nn.softmax(jnp.where(visible, scores, -jnp.inf), axis=-1)
    attn = jnp.einsum("bhqk,bhkd->bhqd", probs, v).transpose(0, 2, 1, 3).reshape(b, s, heads * head_dim)
    x = x + rms_norm(attn @ wo, post_attn, eps)
    h = rms_norm(x, pre_mlp, eps)
    mlp = (jax.nn.gelu(h @ w_gate, approximate=True) * (h @ w_up)) @ w_down
    return x + rms_norm(mlp, post_mlp, eps)
