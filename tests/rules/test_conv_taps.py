"""A unit-stride convolution written as its taps computes what the convolution computes, whatever its
layout; what the taps cannot write (strides, groups other than depthwise) keeps the convolution."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from maxkernel.analysis.program import ProgramBuilder
from maxkernel.rewrites.conv_taps import convs_as_taps
from support import emitted


def _as_taps(fn, *args):  # type: ignore[no-untyped-def]
    program = ProgramBuilder().build(jax.make_jaxpr(fn)(*args), [f"a{i}" for i in range(len(args))])
    count = convs_as_taps(program)
    return count, program, emitted(program, "taps")


def _depthwise(x, w):  # type: ignore[no-untyped-def]
    return jax.lax.conv_general_dilated(x, w, (1,), [(3, 0)], dimension_numbers=("NWC", "WIO", "NWC"),
                                        feature_group_count=x.shape[-1])


def _dense_2d(x, w):  # type: ignore[no-untyped-def]  # channels first, the weight's spatial axes first, dilated
    return jax.lax.conv_general_dilated(x, w, (1, 1), [(2, 2), (1, 0)], rhs_dilation=(2, 1),
                                        dimension_numbers=("NCHW", "HWIO", "NHWC"), precision=jax.lax.Precision.HIGHEST)


@pytest.mark.parametrize("fn,x_shape,w_shape", [(_depthwise, (2, 64, 16), (4, 1, 16)),
                                                (_dense_2d, (2, 8, 12, 10), (3, 2, 8, 5))])
def test_the_taps_compute_the_convolution(fn, x_shape: tuple[int, ...], w_shape: tuple[int, ...]) -> None:  # type: ignore[no-untyped-def]
    kx, kw = jax.random.split(jax.random.key(0))
    x, w = jax.random.normal(kx, x_shape, jnp.float32), jax.random.normal(kw, w_shape, jnp.float32)
    count, program, taps = _as_taps(fn, x, w)
    assert count == 1 and "conv_general_dilated" not in program.primitives()
    (got,) = jax.tree_util.tree_leaves(taps(x, w))
    expected = jax.jit(fn)(x, w)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-5, atol=1e-5)


def test_strided_and_grouped_convolutions_are_kept() -> None:
    x = jnp.ones((2, 64, 16))
    strided = lambda x, w: jax.lax.conv_general_dilated(x, w, (2,), "SAME", dimension_numbers=("NWC", "WIO", "NWC"))  # noqa: E731
    grouped = lambda x, w: jax.lax.conv_general_dilated(x, w, (1,), "SAME", dimension_numbers=("NWC", "WIO", "NWC"),  # noqa: E731
                                                        feature_group_count=4)
    for fn, w in ((strided, jnp.ones((4, 16, 16))), (grouped, jnp.ones((4, 4, 16)))):
        count, program, _ = _as_taps(fn, x, w)
        assert count == 0 and "conv_general_dilated" in program.primitives()
