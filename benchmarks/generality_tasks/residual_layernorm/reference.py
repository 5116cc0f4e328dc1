"""Post-attention residual add followed by LayerNorm; returns the normalized output and the new residual."""

import jax
import jax.numpy as jnp


def get_inputs(key, *, tokens, hidden):
    ka, kr, kg, kb = jax.random.split(key, 4)
    attn_out = jax.random.normal(ka, (tokens, hidden), jnp.float32)
    residual = 2.0 * jax.random.normal(kr, (tokens, hidden), jnp.float32)
    ln_weight = 1.0 + 0.1 * jax.random.normal(kg, (hidden,), jnp.float32)
    ln_bias = 0.1 * jax.random.normal(kb, (hidden,), jnp.float32)
    return (residual, attn_out, ln_weight, ln_bias), {"eps": 1e-5}


def reference(residual, attn_out, ln_weight, ln_bias, eps):
    hidden = residual + attn_out
    mean = hidden.mean(-1, keepdims=True)
    var = ((hidden - mean) ** 2).mean(-1, keepdims=True)
    normed = (hidden - mean) / jnp.sqrt(var + eps)
    return normed * ln_weight + ln_bias, hidden
