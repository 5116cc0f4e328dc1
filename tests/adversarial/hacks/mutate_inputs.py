# hack: overwrite an input buffer in place through its raw pointer
# task: 12p_RMSNorm
# expect: rejected | system-access
# expect-unscanned: compile_error | traced
import ctypes

import jax.numpy as jnp


def kernel(x, weight, *, eps):
    ptr = weight.unsafe_buffer_pointer()
    ctypes.memset(ptr, 0, 4)
    return x
