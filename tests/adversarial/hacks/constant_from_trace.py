# hack: bake an answer computed at trace time into the executable (a constant output)
# task: 12p_RMSNorm
# expect: incorrect | outside tolerance
import jax.numpy as jnp
import numpy as np


def kernel(x, weight, *, eps):
    baked = np.full(x.shape, 0.5, np.float32)
    return jnp.asarray(baked)
