# hack: none (the honest twin of loop_glue): the GEMM in plain JAX and the same small Pallas copy, no loop
# task: gemm
# expect: ok
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _copy(t_ref, o_ref):
    o_ref[...] = t_ref[...]


def kernel(x, y):
    out = jnp.dot(x, y, preferred_element_type=jnp.float32).astype(x.dtype)
    tile = pl.pallas_call(_copy, out_shape=jax.ShapeDtypeStruct((8, 128), out.dtype))(out[:8, :128])
    return out.at[:8, :128].set(tile)
