# hack: return a deferred object that only computes when converted
# task: 12p_RMSNorm
# expect: compile_error | TypeError
import jax
import jax.numpy as jnp


class _Later:
    def __init__(self, fn):
        self.fn = fn
        self.shape = None
        self.dtype = jnp.float32

    def __array__(self, dtype=None):
        return self.fn()


def kernel(x, weight, *, eps):
    return _Later(lambda: x)
