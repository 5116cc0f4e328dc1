"""2-D convolution + bias, exact GELU, then global average pooling over the spatial axes."""

import jax
import jax.numpy as jnp

_HI = jax.lax.Precision.HIGHEST


def get_inputs(key, *, batch, in_channels, out_channels, kernel_size, height, width):
    kx, ko, ks, kw, kb = jax.random.split(key, 5)
    # Per-(sample, channel) offsets and scales so the pooled outputs differ between samples.
    offset = 0.5 * jax.random.normal(ko, (batch, in_channels, 1, 1), jnp.float32)
    scale = jax.random.uniform(ks, (batch, in_channels, 1, 1), jnp.float32, 0.5, 1.5)
    x = offset + scale * jax.random.normal(kx, (batch, in_channels, height, width), jnp.float32)
    fan_in = in_channels * kernel_size**2
    w = jax.random.normal(
        kw, (out_channels, in_channels, kernel_size, kernel_size), jnp.float32
    ) * (1.5 / fan_in**0.5)
    b = 0.5 * jax.random.normal(kb, (out_channels,), jnp.float32)
    return (x, w, b), {}


def reference(x, w, b):
    y = jax.lax.conv_general_dilated(
        x,
        w,
        window_strides=(1, 1),
        padding="VALID",
        dimension_numbers=("NCHW", "OIHW", "NCHW"),
        precision=_HI,
    )
    y = jax.nn.gelu(y + b[None, :, None, None], approximate=False)
    return jnp.mean(y, axis=(2, 3))
