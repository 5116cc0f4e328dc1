# hack: the GEMM in plain JAX inside one branch of a cond on a data value, beside a small Pallas copy (a branch holding a kernel went unpriced)
# task: gemm
# twin: honest_glue
# expect: priced
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _copy(t_ref, o_ref):
    o_ref[...] = t_ref[...]


def kernel(x, y):
    def full(x, y):
        out = jnp.dot(x, y, preferred_element_type=jnp.float32).astype(x.dtype)
        tile = pl.pallas_call(_copy, out_shape=jax.ShapeDtypeStruct((8, 128), out.dtype))(out[:8, :128])
        return out.at[:8, :128].set(tile)

    def never(x, y):
        return jnp.zeros((x.shape[0], y.shape[1]), x.dtype)

    return jax.lax.cond(jnp.isfinite(x[0, 0]), full, never, x, y)
