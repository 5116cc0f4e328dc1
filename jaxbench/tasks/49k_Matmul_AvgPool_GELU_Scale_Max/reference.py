"""Linear layer, 1-D average pooling over features, exact GELU, scale, max over features (KernelBench level 2 #98)."""

import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, in_features, out_features):
    kx, kw, kb = jax.random.split(key, 3)
    bound = 1.0 / in_features**0.5
    x = jax.random.normal(kx, (batch, in_features), jnp.float32)
    weight = jax.random.uniform(kw, (out_features, in_features), jnp.float32, -bound, bound)
    linear_bias = jax.random.uniform(kb, (out_features,), jnp.float32, -bound, bound)
    return (x, weight, linear_bias), {"pool_kernel_size": 16, "scale_factor": 2.0}


def reference(x, weight, linear_bias, *, pool_kernel_size, scale_factor):
    h = jnp.matmul(x, weight.T, precision=jax.lax.Precision.HIGHEST) + linear_bias
    b, n = h.shape
    # AvgPool1d(kernel=stride=pool_kernel_size, no padding): trailing features that do not fill a window are dropped.
    windows = n // pool_kernel_size
    h = h[:, : windows * pool_kernel_size].reshape(b, windows, pool_kernel_size).mean(axis=-1)
    h = jax.nn.gelu(h, approximate=False) * scale_factor
    return jnp.max(h, axis=1)
