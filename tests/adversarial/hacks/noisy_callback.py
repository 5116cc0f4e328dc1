# hack: a host callback that changes the answer slightly on every call (nondeterministic)
# task: 12p_RMSNorm
# expect: rejected | host-callback
# expect-unscanned: rejected | disagree
import itertools

import jax
import jax.numpy as jnp
import numpy as np

_calls = itertools.count()


def _jitter(x):
    return np.float32(next(_calls) * 1e-9)


def kernel(x, weight, *, eps):
    bump = jax.pure_callback(_jitter, jax.ShapeDtypeStruct((), jnp.float32), x[0, 0, 0])
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * weight + bump
