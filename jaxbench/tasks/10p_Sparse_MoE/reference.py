"""Sparse mixture-of-experts layer: top-2 of 8 SwiGLU experts chosen per token by a softmax router."""

import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, seq, hidden, intermediate, num_experts):
    kx, kr, kg, ku, kd = jax.random.split(key, 5)
    x = jax.random.normal(kx, (batch, seq, hidden), jnp.float32).astype(jnp.bfloat16)
    w_router = (jax.random.normal(kr, (hidden, num_experts), jnp.float32) / hidden**0.5).astype(jnp.bfloat16)
    w_gate = jax.random.normal(kg, (num_experts, hidden, intermediate), jnp.float32) / hidden**0.5
    w_up = jax.random.normal(ku, (num_experts, hidden, intermediate), jnp.float32) / hidden**0.5
    w_down = jax.random.normal(kd, (num_experts, intermediate, hidden), jnp.float32) / intermediate**0.5
    args = (x, w_router, w_gate.astype(jnp.bfloat16), w_up.astype(jnp.bfloat16), w_down.astype(jnp.bfloat16))
    return args, {"top_k": 2}


def reference(x, w_router, w_gate, w_up, w_down, *, top_k):
    batch, seq, hidden = x.shape
    num_experts = w_router.shape[1]
    tokens = x.reshape(batch * seq, hidden)

    # Router in float32: softmax over all experts, keep the top_k, renormalize them to sum to one.
    logits = jnp.dot(tokens, w_router, preferred_element_type=jnp.float32)
    probs = jax.nn.softmax(logits, axis=-1)
    top_p, top_idx = jax.lax.top_k(probs, top_k)
    top_w = top_p / jnp.sum(top_p, axis=-1, keepdims=True)
    # combine[t, e]: weight of expert e for token t (zero for experts not chosen).
    combine = jnp.sum(jax.nn.one_hot(top_idx, num_experts, dtype=jnp.float32) * top_w[..., None], axis=1)

    # Every expert is evaluated on every token and masked by its combine weight: simple, not fast.
    out = jnp.zeros((batch * seq, hidden), jnp.float32)
    for e in range(num_experts):
        gate = jnp.dot(tokens, w_gate[e], preferred_element_type=jnp.float32)
        up = jnp.dot(tokens, w_up[e], preferred_element_type=jnp.float32)
        h = (jax.nn.silu(gate) * up).astype(jnp.bfloat16)
        y = jnp.dot(h, w_down[e], preferred_element_type=jnp.float32)
        out = out + combine[:, e : e + 1] * y
    return out.astype(jnp.bfloat16).reshape(batch, seq, hidden)
