"""2-D convolution, instance normalization (per sample and channel, no affine), division by a constant."""

import jax
import jax.numpy as jnp
from jax import lax

_HI = lax.Precision.HIGHEST


def get_inputs(key, *, batch, in_channels, out_channels, height, width, kernel_size):
    kx, kw = jax.random.split(key)
    fan_in = in_channels * kernel_size * kernel_size
    x = jax.random.uniform(kx, (batch, in_channels, height, width), jnp.float32)
    weight = jax.random.normal(kw, (out_channels, in_channels, kernel_size, kernel_size), jnp.float32)
    weight = weight * (1.0 / fan_in) ** 0.5
    # The Conv2d bias is a per-channel constant that the instance norm subtracts away exactly,
    # so it is not an input.
    return (x, weight), {"eps": 1e-5, "divide_by": 2.0}


def reference(x, weight, *, eps, divide_by):
    y = lax.conv_general_dilated(
        x, weight, window_strides=(1, 1), padding="VALID",
        dimension_numbers=("NCHW", "OIHW", "NCHW"), precision=_HI,
    )
    mean = jnp.mean(y, axis=(2, 3), keepdims=True)
    var = jnp.mean(jnp.square(y - mean), axis=(2, 3), keepdims=True)
    y = (y - mean) * lax.rsqrt(var + eps)
    return y / divide_by
