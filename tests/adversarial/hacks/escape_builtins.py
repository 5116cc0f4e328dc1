# hack: reach os through the object graph without importing it
# task: 12p_RMSNorm
# expect: rejected | introspection
import jax.numpy as jnp


def kernel(x, weight, *, eps):
    for cls in ().__class__.__bases__[0].__subclasses__():
        if cls.__name__ == "_wrap_close":
            cls.__init__.__globals__["system"]("true")
    return x
