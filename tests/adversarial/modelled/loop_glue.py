# hack: the whole GEMM in plain JAX beside a tiny Pallas call inside a one-trip fori_loop (the code around it went unpriced)
# task: gemm
# twin: honest_glue
# expect: priced
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _copy(t_ref, o_ref):
    o_ref[...] = t_ref[...]


def kernel(x, y):
    out = jnp.dot(x, y, preferred_element_type=jnp.float32).astype(x.dtype)

    def step(i, acc):
        return pl.pallas_call(_copy, out_shape=jax.ShapeDtypeStruct((8, 128), acc.dtype))(acc)

    tile = jax.lax.fori_loop(0, 1, step, out[:8, :128])
    return out.at[:8, :128].set(tile)
