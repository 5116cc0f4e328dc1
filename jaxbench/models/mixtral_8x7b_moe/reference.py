"""Mixtral 8x7B sparse MoE block: RMSNorm, top-2 router, SwiGLU experts, residual."""

import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, seq, hidden, experts, intermediate, top_k):
    ks = jax.random.split(key, 6)
    x = jax.random.normal(ks[0], (batch, seq, hidden), jnp.float32)
    norm = 1.0 + 0.1 * jax.random.normal(ks[1], (hidden,), jnp.float32)
    router = jax.random.normal(ks[2], (hidden, experts), jnp.float32) / jnp.sqrt(hidden)
    w_gate = jax.random.normal(ks[3], (experts, hidden, intermediate), jnp.float32) / jnp.sqrt(hidden)
    w_up = jax.random.normal(ks[4], (experts, hidden, intermediate), jnp.float32) / jnp.sqrt(hidden)
    w_down = jax.random.normal(ks[5], (experts, intermediate, hidden), jnp.float32) / jnp.sqrt(intermediate)
    return (x, norm, router, w_gate, w_up, w_down), {"top_k": top_k, "eps": 1e-5}


def reference(x, norm, router, w_gate, w_up, w_down, *, top_k, eps):
    b, s, d = x.shape
    h = (x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + eps) * norm).reshape(b * s, d)
    logits = h @ router
    top_vals, top_idx = jax.lax.top_k(logits, top_k)
    weights = jax.nn.softmax(top_vals, axis=-1)
    gates = jnp.sum(jax.nn.one_hot(top_idx, router.shape[1], dtype=h.dtype) * weights[..., None], axis=1)
    act = jax.nn.silu(jnp.einsum("td,edf->etf", h, w_gate)) * jnp.einsum("td,edf->etf", h, w_up)
    out = jnp.einsum("etf,efd->etd", act, w_down)
    return x + jnp.einsum("etd,te->td", out, gates).reshape(b, s, d)
