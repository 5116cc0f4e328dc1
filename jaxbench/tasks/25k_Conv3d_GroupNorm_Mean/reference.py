"""3-D convolution, GroupNorm with affine parameters, then the mean over all non-batch axes."""

import jax
import jax.numpy as jnp
from jax import lax

_HI = lax.Precision.HIGHEST


def get_inputs(key, *, batch, in_channels, out_channels, depth, height, width, kernel_size):
    kx, ko, kw, kb, kg, kh = jax.random.split(key, 6)
    fan_in = in_channels * kernel_size ** 3
    # Per-sample offsets make the post-norm mean vary across the batch instead of being nearly constant.
    offset = jax.random.uniform(ko, (batch, 1, 1, 1, 1), jnp.float32, -1.0, 1.0)
    x = jax.random.uniform(kx, (batch, in_channels, depth, height, width), jnp.float32) + offset
    shape_w = (out_channels, in_channels, kernel_size, kernel_size, kernel_size)
    weight = jax.random.normal(kw, shape_w, jnp.float32) * (1.0 / fan_in) ** 0.5
    conv_bias = 0.5 * jax.random.normal(kb, (out_channels,), jnp.float32)
    gamma = 1.0 + 0.5 * jax.random.normal(kg, (out_channels,), jnp.float32)
    beta = 0.1 * jax.random.normal(kh, (out_channels,), jnp.float32)
    return (x, weight, conv_bias, gamma, beta), {"num_groups": 8, "eps": 1e-5}


def reference(x, weight, conv_bias, gamma, beta, *, num_groups, eps):
    y = lax.conv_general_dilated(
        x, weight, window_strides=(1, 1, 1), padding="VALID",
        dimension_numbers=("NCDHW", "OIDHW", "NCDHW"), precision=_HI,
    )
    y = y + conv_bias[None, :, None, None, None]
    n, c, d, h, w = y.shape
    g = y.reshape(n, num_groups, c // num_groups, d, h, w)
    mean = jnp.mean(g, axis=(2, 3, 4, 5), keepdims=True)
    var = jnp.mean(jnp.square(g - mean), axis=(2, 3, 4, 5), keepdims=True)
    g = (g - mean) * lax.rsqrt(var + eps)
    y = g.reshape(n, c, d, h, w) * gamma[None, :, None, None, None] + beta[None, :, None, None, None]
    return jnp.mean(y, axis=(1, 2, 3, 4))
