"""GeGLU feed-forward block: (gelu(x W_gate) * (x W_up)) W_down, in float32."""

import jax
import jax.numpy as jnp


def get_inputs(key, *, tokens, d_model, d_ff):
    keys = jax.random.split(key, 4)
    hidden_states = jax.random.normal(keys[0], (tokens, d_model), jnp.float32)
    wi_0 = jax.random.normal(keys[1], (d_model, d_ff), jnp.float32) / jnp.sqrt(d_model)
    wi_1 = jax.random.normal(keys[2], (d_model, d_ff), jnp.float32) / jnp.sqrt(d_model)
    wo = jax.random.normal(keys[3], (d_ff, d_model), jnp.float32) / jnp.sqrt(d_ff)
    return (hidden_states, wi_0, wi_1, wo), {}


def reference(hidden_states, wi_0, wi_1, wo):
    hidden_gelu = jax.nn.gelu(jnp.matmul(hidden_states, wi_0), approximate=True)
    hidden_linear = jnp.matmul(hidden_states, wi_1)
    return jnp.matmul(hidden_gelu * hidden_linear, wo)
