"""GEMM with a fused bias + ReLU epilogue as a Pallas kernel (candidate for 41k_Gemm_Add_ReLU).

The grid walks (M tiles, N tiles, K tiles) with K innermost. Each step multiplies a (block_m, block_k)
tile of x by a (block_n, block_k) tile of the [N, K] weight, contracting over K without transposing the
weight in HBM, and accumulates in an f32 VMEM scratch tile. On the last K step the bias add and ReLU run
on the accumulator and the tile is written once. Blocks are multiples of 128 so the kernel also lowers for
TPU, and stay within a few MiB of VMEM at the task's full size.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

_CONTRACT_K = (((1,), (1,)), ((), ()))


def _gemm_bias_relu(x_ref, w_ref, b_ref, o_ref, acc_ref):
    k = pl.program_id(2)

    @pl.when(k == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jax.lax.dot_general(
        x_ref[...], w_ref[...], _CONTRACT_K,
        precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32,
    )

    @pl.when(k == pl.num_programs(2) - 1)
    def _store():
        o_ref[...] = jnp.maximum(acc_ref[...] + b_ref[...], 0.0).astype(o_ref.dtype)


def _block(extent, preferred):
    block = min(preferred, extent)
    while extent % block:
        block //= 2
    return max(block, 1)


def kernel(x, weight, bias, *, block_m=256, block_n=512, block_k=1024):
    m, k = x.shape
    n = weight.shape[0]
    bm, bn, bk = _block(m, block_m), _block(n, block_n), _block(k, block_k)
    return pl.pallas_call(
        _gemm_bias_relu,
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        grid=(m // bm, n // bn, k // bk),
        in_specs=[
            pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
            pl.BlockSpec((bn, bk), lambda i, j, kk: (j, kk)),
            pl.BlockSpec((1, bn), lambda i, j, kk: (0, j)),
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
    )(x, weight, bias.reshape(1, n))
