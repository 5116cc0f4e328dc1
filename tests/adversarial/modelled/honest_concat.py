# hack: none (the honest twin of hbm_dma): the concatenation in plain JAX, a Pallas copy of one tile beside it
# task: concat
# expect: ok
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _copy(t_ref, o_ref):
    o_ref[...] = t_ref[...]


def kernel(a, b):
    out = jnp.concatenate([a, b], axis=0)
    tile = pl.pallas_call(_copy, out_shape=jax.ShapeDtypeStruct((8, 128), out.dtype))(out[:8, :128])
    return out.at[:8, :128].set(tile)
