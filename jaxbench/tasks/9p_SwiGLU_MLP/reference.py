"""SwiGLU feed-forward block of an LLM: (silu(x @ W_gate) * (x @ W_up)) @ W_down, in bfloat16."""

import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, seq, hidden, intermediate):
    kx, kg, ku, kd = jax.random.split(key, 4)
    x = jax.random.normal(kx, (batch, seq, hidden), jnp.float32).astype(jnp.bfloat16)
    w_gate = (jax.random.normal(kg, (hidden, intermediate), jnp.float32) / hidden**0.5).astype(jnp.bfloat16)
    w_up = (jax.random.normal(ku, (hidden, intermediate), jnp.float32) / hidden**0.5).astype(jnp.bfloat16)
    w_down = (jax.random.normal(kd, (intermediate, hidden), jnp.float32) / intermediate**0.5).astype(jnp.bfloat16)
    return (x, w_gate, w_up, w_down), {}


def reference(x, w_gate, w_up, w_down):
    gate = jnp.einsum("bsh,hi->bsi", x, w_gate, preferred_element_type=jnp.float32)
    up = jnp.einsum("bsh,hi->bsi", x, w_up, preferred_element_type=jnp.float32)
    act = (jax.nn.silu(gate) * up).astype(jnp.bfloat16)
    out = jnp.einsum("bsi,ih->bsh", act, w_down, preferred_element_type=jnp.float32)
    return out.astype(jnp.bfloat16)
