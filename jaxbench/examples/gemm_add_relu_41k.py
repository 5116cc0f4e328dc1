"""GEMM with a fused bias + ReLU epilogue as a Pallas kernel (candidate for 41k_Gemm_Add_ReLU).

Each grid step owns one (block_m, block_n) output tile and reads the whole K extent of its rows of x
and of its rows of the [N, K] weight, contracting over K without transposing the weight in HBM; the
bias add and ReLU run on the tile before it is stored.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

_CONTRACT_K = (((1,), (1,)), ((), ()))


def _gemm_bias_relu(x_ref, w_ref, b_ref, o_ref):
    acc = jax.lax.dot_general(
        x_ref[...], w_ref[...], _CONTRACT_K,
        precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32,
    )
    o_ref[...] = jnp.maximum(acc + b_ref[...], 0.0).astype(o_ref.dtype)


def _block(extent, preferred):
    block = min(preferred, extent)
    while extent % block:
        block //= 2
    return max(block, 1)


def kernel(x, weight, bias, *, block_m=256, block_n=512):
    m, k = x.shape
    n = weight.shape[0]
    bm, bn = _block(m, block_m), _block(n, block_n)
    return pl.pallas_call(
        _gemm_bias_relu,
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        grid=(m // bm, n // bn),
        in_specs=[
            pl.BlockSpec((bm, k), lambda i, j: (i, 0)),
            pl.BlockSpec((bn, k), lambda i, j: (j, 0)),
            pl.BlockSpec((1, bn), lambda i, j: (0, j)),
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
    )(x, weight, bias.reshape(1, n))
