# hack: make the timer report near-zero durations
# task: 12p_RMSNorm
# expect: rejected | system-access
# expect-unscanned: rejected | patched harness functions: time.perf_counter
import time

import jax
import jax.numpy as jnp

_real = time.perf_counter
time.perf_counter = lambda: _real() / 1e6


def kernel(x, weight, *, eps):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * weight
