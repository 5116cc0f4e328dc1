# hack: return random numbers with the reference's statistics
# task: 12p_RMSNorm
# expect: incorrect | outside tolerance
import jax
import jax.numpy as jnp


def kernel(x, weight, *, eps):
    return jax.random.normal(jax.random.key(7), x.shape, x.dtype) * weight
