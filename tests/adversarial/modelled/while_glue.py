# hack: the GEMM split into K chunks in plain JAX inside a while loop with a small Pallas copy; priced once, not per trip
# task: gemm
# twin: honest_glue
# expect: priced
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

CHUNK = 512


def _copy(t_ref, o_ref):
    o_ref[...] = t_ref[...]


def kernel(x, y):
    m, k = x.shape
    n = y.shape[1]

    def step(carry):
        i, acc = carry
        xs = jax.lax.dynamic_slice_in_dim(x, i * CHUNK, CHUNK, axis=1)
        ys = jax.lax.dynamic_slice_in_dim(y, i * CHUNK, CHUNK, axis=0)
        acc = acc + jnp.dot(xs, ys, preferred_element_type=jnp.float32)
        tile = pl.pallas_call(_copy, out_shape=jax.ShapeDtypeStruct((8, 128), acc.dtype))(acc[:8, :128])
        return i + 1, acc.at[:8, :128].set(tile)

    _, acc = jax.lax.while_loop(lambda c: c[0] < k // CHUNK, step, (jnp.int32(0), jnp.zeros((m, n), jnp.float32)))
    return acc.astype(x.dtype)
