"""Mamba's short convolution: a causal depthwise conv1d over time (kernel width 4) with bias, then SiLU."""

import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, dim, seqlen, width):
    kx, kw, kb = jax.random.split(key, 3)
    x = jax.random.normal(kx, (batch, dim, seqlen), jnp.float32)
    conv_weight = jax.random.normal(kw, (dim, width), jnp.float32) / width**0.5
    conv_bias = 0.1 * jax.random.normal(kb, (dim,), jnp.float32)
    return (x, conv_weight, conv_bias), {}


def reference(x, conv_weight, conv_bias):
    # x: [batch, dim, seqlen]; out[b, c, t] = sum_j w[c, j] * x[b, c, t - (width - 1) + j]  (zeros before t = 0)
    width = conv_weight.shape[1]
    seqlen = x.shape[-1]
    padded = jnp.pad(x, ((0, 0), (0, 0), (width - 1, 0)))
    out = conv_bias[None, :, None]
    for j in range(width):
        out = out + conv_weight[None, :, j, None] * padded[:, :, j : j + seqlen]
    return jax.nn.silu(out)
