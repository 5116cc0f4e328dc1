"""Mixtral 8x7B sparse MoE block in bf16: RMSNorm, float32 top-2 router, SwiGLU experts, residual.

Activations and weights are bf16; norm statistics, router logits, the top-2 choice and the softmax over it
are float32 (the HF implementation's softmax runs in float32) and every matmul accumulates in float32
(``wide``). Each token of ``x`` leans towards ``top_k`` experts drawn for it, so the router's top-k margin is
far above bf16 rounding and the choice never flips between numerics. Called on float64 inputs the same code
is the float64 evaluation of the same math that the tolerance is measured against.
"""

import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, seq, hidden, experts, intermediate, top_k):
    ks = jax.random.split(key, 7)
    router = jax.random.normal(ks[2], (hidden, experts), jnp.float32) / jnp.sqrt(hidden)
    x = jax.random.normal(ks[0], (batch, seq, hidden), jnp.float32) + leaning(ks[6], router, (batch, seq), top_k)
    norm = 1.0 + 0.1 * jax.random.normal(ks[1], (hidden,), jnp.float32)
    w_gate = jax.random.normal(ks[3], (experts, hidden, intermediate), jnp.float32) / jnp.sqrt(hidden)
    w_up = jax.random.normal(ks[4], (experts, hidden, intermediate), jnp.float32) / jnp.sqrt(hidden)
    w_down = jax.random.normal(ks[5], (experts, intermediate, hidden), jnp.float32) / jnp.sqrt(intermediate)
    args = tuple(a.astype(jnp.bfloat16) for a in (x, norm, router, w_gate, w_up, w_down))
    return args, {"top_k": top_k, "eps": 1e-5}


def leaning(key, router, tokens, top_k, strength=12.0):
    """A push along the router columns of ``top_k`` experts drawn per token (columns of norm about one)."""
    draw = jax.random.uniform(key, tokens + (router.shape[1],))
    picked = (draw >= jnp.sort(draw, axis=-1)[..., -top_k:-top_k + 1]).astype(jnp.float32)
    return strength * picked @ router.T


def wide(x):
    return jnp.promote_types(x.dtype, jnp.float32)


def reference(x, norm, router, w_gate, w_up, w_down, *, top_k, eps):
    b, s, d = x.shape
    f = x.astype(wide(x))
    h = (norm * (f * jax.lax.rsqrt(jnp.mean(jnp.square(f), axis=-1, keepdims=True) + eps)).astype(x.dtype))
    h = h.reshape(b * s, d)
    logits = jnp.matmul(h, router, preferred_element_type=wide(h))
    top_vals, top_idx = jax.lax.top_k(logits, top_k)
    weights = jax.nn.softmax(top_vals, axis=-1)
    gates = jnp.sum(jax.nn.one_hot(top_idx, router.shape[1], dtype=weights.dtype) * weights[..., None], axis=1)
    gate = jnp.einsum("td,edf->etf", h, w_gate)
    up = jnp.einsum("td,edf->etf", h, w_up)
    out = jnp.einsum("etf,efd->etd", jax.nn.silu(gate) * up, w_down)
    moe = jnp.einsum("etd,te->td", out, gates.astype(h.dtype), preferred_element_type=wide(h)).astype(h.dtype)
    return x + moe.reshape(b, s, d)
