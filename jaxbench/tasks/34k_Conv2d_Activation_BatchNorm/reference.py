"""2-D convolution + bias, Mish (tanh(softplus(x)) * x), then training-mode BatchNorm2d."""

import jax
import jax.numpy as jnp

_HI = jax.lax.Precision.HIGHEST


def get_inputs(key, *, batch, in_channels, out_channels, kernel_size, height, width):
    kx, kw, kb, kg, kh = jax.random.split(key, 5)
    x = jax.random.normal(kx, (batch, in_channels, height, width), jnp.float32)
    fan_in = in_channels * kernel_size**2
    w = jax.random.normal(
        kw, (out_channels, in_channels, kernel_size, kernel_size), jnp.float32
    ) * (1.5 / fan_in**0.5)
    b = 0.5 * jax.random.normal(kb, (out_channels,), jnp.float32)
    gamma = 1.0 + 0.3 * jax.random.normal(kg, (out_channels,), jnp.float32)
    beta = 0.3 * jax.random.normal(kh, (out_channels,), jnp.float32)
    return (x, w, b, gamma, beta), {"eps": 1e-5}


def reference(x, w, b, gamma, beta, *, eps):
    y = jax.lax.conv_general_dilated(
        x,
        w,
        window_strides=(1, 1),
        padding="VALID",
        dimension_numbers=("NCHW", "OIHW", "NCHW"),
        precision=_HI,
    )
    y = y + b[None, :, None, None]
    y = jnp.tanh(jax.nn.softplus(y)) * y
    mean = jnp.mean(y, axis=(0, 2, 3), keepdims=True)
    var = jnp.mean(jnp.square(y - mean), axis=(0, 2, 3), keepdims=True)
    y = (y - mean) * jax.lax.rsqrt(var + eps)
    return y * gamma[None, :, None, None] + beta[None, :, None, None]
