"""Pre-attention block of a decoder layer: RMSNorm of the residual stream, then the fused QKV projection."""

import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, seq, dim, n_heads, n_kv_heads, head_dim):
    kx, kn, kw = jax.random.split(key, 3)
    x = jax.random.normal(kx, (batch, seq, dim), jnp.float32).astype(jnp.bfloat16)
    norm_weight = (1.0 + 0.1 * jax.random.normal(kn, (dim,), jnp.float32)).astype(jnp.bfloat16)
    qkv_out = (n_heads + 2 * n_kv_heads) * head_dim
    wqkv = (jax.random.normal(kw, (dim, qkv_out), jnp.float32) / dim**0.5).astype(jnp.bfloat16)
    return (x, norm_weight, wqkv), {"eps": 1e-6}


def reference(x, norm_weight, wqkv, eps=1e-6):
    xf = x.astype(jnp.float32)
    rms = jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    h = (xf * rms).astype(jnp.bfloat16) * norm_weight
    return jnp.einsum("bsd,de->bse", h, wqkv, preferred_element_type=jnp.float32).astype(jnp.bfloat16)
