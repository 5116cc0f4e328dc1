"""GPU candidate sources for the GPU target tests (never run here: they are lowered and modelled)."""

from __future__ import annotations


def triton_matmul_source(
    bm: int, bn: int, bk: int, warps: int = 4, stages: int = 3, pl_load: bool = False
) -> str:
    """A Triton-backend tiled matmul for the tgt_matmul task: a program per output block, k looped inside;
    its tiles read by ref indexing (``get``) or, with ``pl_load``, through ``plt.load`` (``masked_load``)."""
    x_tile = "plt.load(x_ref.at[:, pl.ds(i * BK, BK)])" if pl_load else "x_ref[:, pl.ds(i * BK, BK)]"
    y_tile = "plt.load(y_ref.at[pl.ds(i * BK, BK), :])" if pl_load else "y_ref[pl.ds(i * BK, BK), :]"
    return f'''\
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

BM, BN, BK = {bm}, {bn}, {bk}


def _body(x_ref, y_ref, o_ref):
    k = x_ref.shape[1]

    def step(i, acc):
        x = {x_tile}
        y = {y_tile}
        return acc + jnp.dot(x, y, preferred_element_type=jnp.float32)

    acc = jax.lax.fori_loop(0, k // BK, step, jnp.zeros((BM, BN), jnp.float32))
    o_ref[...] = acc.astype(o_ref.dtype)


def kernel(x, y):
    m, k = x.shape
    n = y.shape[1]
    return pl.pallas_call(
        _body,
        grid=(m // BM, n // BN),
        in_specs=[pl.BlockSpec((BM, k), lambda i, j: (i, 0)), pl.BlockSpec((k, BN), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((BM, BN), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        compiler_params=plt.CompilerParams(num_warps={warps}, num_stages={stages}),
    )(x, y)
'''


def mosaic_scale_source(bm: int, bn: int) -> str:
    """A blockwise kernel with no Triton parameters (it scales x; lowering is what is tested): it lowers
    through Mosaic GPU, which runs on Hopper and later only."""
    return f'''\
import jax
from jax.experimental import pallas as pl


def _body(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2


def kernel(x, y):
    m, k = x.shape
    return pl.pallas_call(
        _body,
        grid=(m // {bm}, k // {bn}),
        in_specs=[pl.BlockSpec(({bm}, {bn}), lambda i, j: (i, j))],
        out_specs=pl.BlockSpec(({bm}, {bn}), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x)
'''
