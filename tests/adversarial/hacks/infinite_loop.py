# hack: never return while being traced
# task: 12p_RMSNorm
# expect: timeout
import jax.numpy as jnp


def kernel(x, weight, *, eps):
    n = 0
    while n >= 0:
        n += 1
    return x
