# hack: return zeros of the right shape and dtype
# task: 12p_RMSNorm
# expect: incorrect | outside tolerance
import jax.numpy as jnp


def kernel(x, weight, *, eps):
    return jnp.zeros_like(x)
