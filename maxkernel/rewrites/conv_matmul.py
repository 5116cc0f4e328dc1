"""Convolutions with few input channels (strided, padded or transposed) as one matmul over patches.

A direct convolution over a handful of input channels keeps the vector units poorly fed (on this
project's CPU, XLA's convolution over 3 or 8 channels runs several times below its matmul rate). The
same result is a matmul: gather the ``prod(kernel)`` shifted windows channels-last into patches
[batch, *out_spatial, prod(kernel) * C] and multiply by the weight laid out [prod(kernel) * C, O]. It
pays a patch buffer ``prod(kernel)`` times the input, so it is proposed only for narrow inputs (at most
``MAX_CHANNELS``); the evaluator decides whether it wins.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp

from maxkernel.analysis.program import Program, Var
from maxkernel.rewrites.base import Rewrite
from maxkernel.rewrites.build import splice_traced

MAX_CHANNELS = 8


def _plain(node) -> bool:  # type: ignore[no-untyped-def]
    p = node.params
    x, w = node.ins
    if not (isinstance(x, Var) and isinstance(w, Var)):
        return False
    nd = len(x.shape) - 2
    dn = p["dimension_numbers"]
    natural = tuple(range(nd + 2))
    return (tuple(dn.lhs_spec) == natural and tuple(dn.rhs_spec) == natural and tuple(dn.out_spec) == natural
            and tuple(p["rhs_dilation"]) == (1,) * nd and int(p["feature_group_count"]) == 1
            and int(p["batch_group_count"]) == 1 and x.shape[1] <= MAX_CHANNELS)


def _patch_matmul(padding: tuple[tuple[int, int], ...], strides: tuple[int, ...],
                  dilation: tuple[int, ...]):  # type: ignore[no-untyped-def]
    def conv(x, w):  # type: ignore[no-untyped-def]
        nd = x.ndim - 2
        if any(lo or hi for lo, hi in padding) or any(d > 1 for d in dilation):
            # A transposed convolution's input dilation is interior padding; edges pad as the conv does.
            x = jax.lax.pad(x, jnp.zeros((), x.dtype),
                            ((0, 0, 0), (0, 0, 0)) + tuple((lo, hi, d - 1) for (lo, hi), d in zip(padding, dilation)))
        kernel = w.shape[2:]
        out = tuple((x.shape[2 + i] - kernel[i]) // strides[i] + 1 for i in range(nd))
        xt = jnp.moveaxis(x, 1, -1)
        windows = [xt[(slice(None),) + tuple(slice(o, o + (n - 1) * s + 1, s) for o, n, s in zip(offset, out, strides))
                      + (slice(None),)]
                   for offset in itertools.product(*(range(k) for k in kernel))]
        patches = jnp.concatenate(windows, axis=-1)  # [..., prod(kernel) * C], ordered (offset, channel)
        weight = jnp.moveaxis(w, (0, 1), (-1, -2)).reshape(-1, w.shape[0])  # [prod(kernel) * C, O]
        y = jax.lax.dot_general(patches, weight, (((nd + 1,), (0,)), ((), ())), precision=jax.lax.Precision.HIGHEST)
        return jnp.moveaxis(y, -1, 1)

    return conv


def conv_to_matmul(program: Program) -> int:
    count = 0
    for node in list(program.nodes):
        if node.prim == "conv_general_dilated" and _plain(node):
            p = node.params
            padding = tuple((int(a), int(b)) for a, b in p["padding"])
            splice_traced(program, node, _patch_matmul(padding, tuple(int(s) for s in p["window_strides"]),
                                                       tuple(int(d) for d in p["lhs_dilation"])))
            count += 1
    return count


# On TPU the convolution itself runs on the MXU; a patch buffer would only add HBM traffic there.
CONV_AS_MATMUL = Rewrite("conv_as_matmul", "narrow-channel convolution as one matmul over channels-last patches",
                         conv_to_matmul, targets=("cpu",))
