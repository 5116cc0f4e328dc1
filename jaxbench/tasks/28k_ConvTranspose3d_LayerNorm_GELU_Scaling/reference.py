"""3-D transposed convolution, LayerNorm over the last (width) axis with affine, exact GELU, scaling."""

import jax
import jax.numpy as jnp
from jax import lax

_HI = lax.Precision.HIGHEST


def get_inputs(key, *, batch, in_channels, out_channels, depth, height, width, kernel_size):
    kx, kw, kb, kg, kh = jax.random.split(key, 5)
    stride, padding = 2, 1
    w_out = (width - 1) * stride - 2 * padding + kernel_size
    x = jax.random.uniform(kx, (batch, in_channels, depth, height, width), jnp.float32)
    # PyTorch ConvTranspose3d weight layout: [in_channels, out_channels, kD, kH, kW].
    shape_w = (in_channels, out_channels, kernel_size, kernel_size, kernel_size)
    fan = in_channels * kernel_size ** 3 / stride ** 3  # taps reaching one output position
    weight = jax.random.normal(kw, shape_w, jnp.float32) * (1.0 / fan) ** 0.5
    conv_bias = 0.5 * jax.random.normal(kb, (out_channels,), jnp.float32)
    # nn.LayerNorm(out_channels) acts on the last axis, whose length w_out equals out_channels
    # in the KernelBench configuration.
    gamma = 1.0 + 0.3 * jax.random.normal(kg, (w_out,), jnp.float32)
    beta = 0.3 * jax.random.normal(kh, (w_out,), jnp.float32)
    static = {"stride": stride, "padding": padding, "eps": 1e-5, "scaling_factor": 1.0}
    return (x, weight, conv_bias, gamma, beta), static


def _conv_transpose3d(x, weight, stride, padding):
    # Transposed conv == stride-1 conv over the stride-dilated input with the spatially flipped,
    # in/out-swapped kernel and (k - 1 - padding) zero padding on each side.
    k = weight.shape[2]
    rhs = jnp.flip(weight, axis=(2, 3, 4)).transpose(1, 0, 2, 3, 4)
    pad = k - 1 - padding
    return lax.conv_general_dilated(
        x, rhs, window_strides=(1, 1, 1), padding=[(pad, pad)] * 3,
        lhs_dilation=(stride, stride, stride),
        dimension_numbers=("NCDHW", "OIDHW", "NCDHW"), precision=_HI,
    )


def reference(x, weight, conv_bias, gamma, beta, *, stride, padding, eps, scaling_factor):
    y = _conv_transpose3d(x, weight, stride, padding) + conv_bias[None, :, None, None, None]
    mean = jnp.mean(y, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(y - mean), axis=-1, keepdims=True)
    y = (y - mean) * lax.rsqrt(var + eps) * gamma + beta
    y = jax.nn.gelu(y, approximate=False)
    return y * scaling_factor
