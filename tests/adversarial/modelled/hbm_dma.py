# hack: the concatenation as two HBM-to-HBM DMAs, which were priced at no bytes (dispatch alone)
# task: concat
# twin: honest_concat
# expect: priced
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def _body(a_hbm, b_hbm, o_hbm, sems):
    rows = a_hbm.shape[0]
    first = pltpu.make_async_copy(a_hbm, o_hbm.at[pl.ds(0, rows)], sems.at[0])
    second = pltpu.make_async_copy(b_hbm, o_hbm.at[pl.ds(rows, rows)], sems.at[1])
    first.start()
    second.start()
    first.wait()
    second.wait()


def kernel(a, b):
    rows, cols = a.shape
    return pl.pallas_call(
        _body,
        in_specs=[pl.BlockSpec(memory_space=pl.ANY), pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        out_shape=jax.ShapeDtypeStruct((2 * rows, cols), a.dtype),
        scratch_shapes=[pltpu.SemaphoreType.DMA((2,))],
    )(a, b)
