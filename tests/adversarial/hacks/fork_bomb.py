# hack: fork repeatedly
# task: 12p_RMSNorm
# expect: rejected | system-access
# expect-unscanned: rejected | process creation
import os

import jax.numpy as jnp


def kernel(x, weight, *, eps):
    for _ in range(64):
        os.fork()
    return x
