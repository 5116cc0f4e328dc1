"""Conv2d, GroupNorm, tanh, HardSwish, residual add of the conv output, LogSumExp over channels.

KernelBench level 2 #92, NCHW layout throughout; the output keeps a singleton channel axis.
"""

import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, in_channels, out_channels, height, width, kernel_size, groups):
    kx, kw, kb, kg, kbeta = jax.random.split(key, 5)
    bound = 1.0 / (in_channels * kernel_size * kernel_size) ** 0.5
    x = jax.random.normal(kx, (batch, in_channels, height, width), jnp.float32)
    conv_weight = jax.random.uniform(
        kw, (out_channels, in_channels, kernel_size, kernel_size), jnp.float32, -bound, bound
    )
    conv_bias = jax.random.uniform(kb, (out_channels,), jnp.float32, -bound, bound)
    gn_weight = 1.0 + 0.2 * jax.random.normal(kg, (out_channels,), jnp.float32)
    gn_bias = 0.2 * jax.random.normal(kbeta, (out_channels,), jnp.float32)
    return (x, conv_weight, conv_bias, gn_weight, gn_bias), {"groups": groups, "eps": 1e-5}


def reference(x, conv_weight, conv_bias, gn_weight, gn_bias, *, groups, eps):
    y = jax.lax.conv_general_dilated(
        x,
        conv_weight,
        window_strides=(1, 1),
        padding="VALID",
        dimension_numbers=("NCHW", "OIHW", "NCHW"),
        precision=jax.lax.Precision.HIGHEST,
    )
    y = y + conv_bias[None, :, None, None]
    n, c, h, w = y.shape
    g = y.reshape(n, groups, c // groups, h, w)
    mean = jnp.mean(g, axis=(2, 3, 4), keepdims=True)
    var = jnp.mean(jnp.square(g - mean), axis=(2, 3, 4), keepdims=True)
    z = ((g - mean) * jax.lax.rsqrt(var + eps)).reshape(n, c, h, w)
    z = z * gn_weight[None, :, None, None] + gn_bias[None, :, None, None]
    z = jax.nn.hard_swish(jnp.tanh(z))
    return jax.nn.logsumexp(y + z, axis=1, keepdims=True)
