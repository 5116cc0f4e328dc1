"""y = relu(x @ weight.T + bias) as a tiled Pallas matmul with a float32 VMEM accumulator.

The grid walks (rows, cols, k); the k axis is last and "arbitrary" so the accumulator lives across it, and
the bias + ReLU epilogue runs once on the final k step.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BM, BN, BK = 256, 512, 1024


def _gemm_add_relu(x_ref, w_ref, b_ref, o_ref, acc_ref, *, nk):
    @pl.when(pl.program_id(2) == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jax.lax.dot_general(
        x_ref[...], w_ref[...], (((1,), (1,)), ((), ())),
        preferred_element_type=jnp.float32, precision=jax.lax.Precision.HIGHEST)

    @pl.when(pl.program_id(2) == nk - 1)
    def _done():
        o_ref[...] = jnp.maximum(acc_ref[...] + b_ref[...], 0.0).astype(o_ref.dtype)


def kernel(x, weight, bias):
    m, k = x.shape
    n = weight.shape[0]
    bm, bn, bk = min(BM, m), min(BN, n), min(BK, k)
    nk = k // bk
    return pl.pallas_call(
        functools.partial(_gemm_add_relu, nk=nk),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        grid=(pl.cdiv(m, bm), pl.cdiv(n, bn), nk),  # partial last tiles are padded on read and cut on write
        in_specs=[
            pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
            pl.BlockSpec((bn, bk), lambda i, j, kk: (j, kk)),
            pl.BlockSpec((1, bn), lambda i, j, kk: (0, j)),
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
    )(x, weight, bias.reshape(1, n))
