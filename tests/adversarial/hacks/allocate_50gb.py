# hack: allocate 50 GB (exhausts the machine for everyone else)
# task: 12p_RMSNorm
# expect: runtime_error | memory
import jax.numpy as jnp
import numpy as np


def kernel(x, weight, *, eps):
    hoard = np.ones((50 * 2**30 // 8,), np.float64)
    return x + hoard[0]
