# hack: import Pallas to be labelled a kernel, but compute with plain jnp
# task: 12p_RMSNorm
# expect: rejected | no pallas_call
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def kernel(x, weight, *, eps):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * weight
