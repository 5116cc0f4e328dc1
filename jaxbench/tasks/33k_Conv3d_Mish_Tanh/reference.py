"""3-D convolution (NCDHW, stride 1, no padding) + bias, then Mish, then tanh."""

import jax
import jax.numpy as jnp

_HI = jax.lax.Precision.HIGHEST


def get_inputs(key, *, batch, in_channels, out_channels, kernel_size, depth, height, width):
    kx, kw, kb = jax.random.split(key, 3)
    x = jax.random.normal(kx, (batch, in_channels, depth, height, width), jnp.float32)
    fan_in = in_channels * kernel_size**3
    w = jax.random.normal(
        kw, (out_channels, in_channels, kernel_size, kernel_size, kernel_size), jnp.float32
    ) * (1.5 / fan_in**0.5)
    b = 0.3 * jax.random.normal(kb, (out_channels,), jnp.float32)
    return (x, w, b), {}


def reference(x, w, b):
    y = jax.lax.conv_general_dilated(
        x,
        w,
        window_strides=(1, 1, 1),
        padding="VALID",
        dimension_numbers=("NCDHW", "OIDHW", "NCDHW"),
        precision=_HI,
    )
    y = y + b[None, :, None, None, None]
    mish = y * jnp.tanh(jax.nn.softplus(y))
    return jnp.tanh(mish)
