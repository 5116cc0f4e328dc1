"""2-D convolution (valid padding, stride 1) + per-channel conv bias, ReLU, then a second per-channel bias add."""

import jax
import jax.numpy as jnp
from jax import lax

_HI = lax.Precision.HIGHEST


def get_inputs(key, *, batch, in_channels, out_channels, height, width, kernel_size):
    kx, kw, kb, kc = jax.random.split(key, 4)
    fan_in = in_channels * kernel_size * kernel_size
    x = jax.random.uniform(kx, (batch, in_channels, height, width), jnp.float32)
    weight = jax.random.normal(kw, (out_channels, in_channels, kernel_size, kernel_size), jnp.float32)
    weight = weight * (1.0 / fan_in) ** 0.5
    conv_bias = 0.2 * jax.random.normal(kb, (out_channels,), jnp.float32)
    bias = jax.random.normal(kc, (out_channels, 1, 1), jnp.float32)
    return (x, weight, conv_bias, bias), {}


def reference(x, weight, conv_bias, bias):
    y = lax.conv_general_dilated(
        x, weight, window_strides=(1, 1), padding="VALID",
        dimension_numbers=("NCHW", "OIHW", "NCHW"), precision=_HI,
    )
    y = y + conv_bias[None, :, None, None]
    y = jnp.maximum(y, 0.0)
    return y + bias[None]
