"""The sub-pixel decomposition of a transposed convolution: one stride-1 convolution of the undilated input
with phase-stacked output channels, then a depth-to-space interleave, equal to JAX's transposed
convolution for any strides, padding and kernel size the template accepts."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from maxkernel.analysis.program import ProgramBuilder
from maxkernel.templates.conv_phases import Phases, _depth_to_space, _phase_input, _phase_taps, _phase_weight, kernel_shape, phases_of
from maxkernel.templates.tpu_conv import match

_HI = lax.Precision.HIGHEST


def _numbers(nd: int) -> tuple[str, str, str]:
    return ("NCHW", "OIHW", "NCHW") if nd == 2 else ("NCDHW", "OIDHW", "NCDHW")


@pytest.mark.parametrize(("strides", "k", "pads", "size"), [
    ((2, 2), 4, (2, 2), 5),      # PyTorch stride 2, padding 1, kernel 4 (28k's, in 2-D)
    ((3, 3), 3, (1, 2), 4),      # stride 3, asymmetric padding
    ((2, 3), 3, (0, 1), 4),      # a stride per axis
    ((3, 3), 2, (1, 1), 3),      # fewer taps than the stride: one phase has none (its outputs are 0)
    ((2, 2, 2), 4, (2, 2), 3),   # 28k's transposed 3-D convolution
    ((2, 1, 2), 3, (2, 0), 3),   # one axis not dilated
])
@pytest.mark.slow
def test_the_phases_convolution_interleaved_is_jaxs_transposed_convolution(
        strides: tuple[int, ...], k: int, pads: tuple[int, int], size: int) -> None:
    nd = len(strides)
    x = jax.random.normal(jax.random.key(0), (2, 3) + (size,) * nd, jnp.float32)
    w = jax.random.normal(jax.random.key(1), (5, 3) + (k,) * nd, jnp.float32)
    expected = lax.conv_transpose(x, w, strides, [pads] * nd, dimension_numbers=_numbers(nd), precision=_HI)

    low, high = (pads[0],) * nd, (pads[1],) * nd
    xp, extents = _phase_input(x, (k,) * nd, strides, low, high)
    wp = _phase_weight(w, strides, low)
    assert (wp.shape[2:], xp.shape[2:]) == kernel_shape((size,) * nd, (k,) * nd, Phases(strides, low, high))
    assert wp.shape[0] == 5 * int(np.prod(strides))  # the phases stacked on the output channels
    assert all(t <= -(-k // s) + 1 for t, s in zip(wp.shape[2:], strides))  # never the dilated window
    phases = lax.conv_general_dilated(xp, wp, (1,) * nd, [(0, 0)] * nd, dimension_numbers=_numbers(nd), precision=_HI)
    got = _depth_to_space(phases, strides, extents)
    assert got.shape == expected.shape
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), atol=1e-5, rtol=1e-5)


def test_each_phase_takes_exactly_the_taps_that_meet_real_inputs() -> None:
    # Stride 2, low padding 2, kernel 4: phase 0 reads inputs m - 1, m through taps 0, 2; phase 1 reads
    # m, m + 1 through taps 1, 3; the common window is offsets -1..1, and 4 marks a zero tap.
    assert _phase_taps(4, 2, 2) == (-1, 3, [[0, 2, 4], [4, 1, 3]])
    assert _phase_taps(2, 3, 1) == (0, 1, [[1], [0], [2]])  # phase 2 has no tap: 2 is k, a zero
    assert phases_of(((1, 1, 0), (0, 0, 0))) is None  # no input dilation: a plain convolution
    assert phases_of(((2, 2, 1), (1, 0, 2))) == Phases((2, 3), (2, 1), (2, 0))


def _match(fn, *shapes: tuple[int, ...]):  # type: ignore[no-untyped-def]
    avals = [jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes]
    return match(ProgramBuilder().build(jax.make_jaxpr(fn)(*avals), ["x", "w"][: len(shapes)]))


@pytest.mark.parametrize(("params", "reason"), [
    ({"window_strides": (2, 2), "padding": [(2, 2)] * 2}, "strided"),   # strided output of a dilated input
    ({"window_strides": (1, 1), "padding": [(-1, 2)] * 2}, "negative padding"),  # PyTorch padding > k - 1
    ({"window_strides": (1, 1), "padding": [(2, 2)] * 2, "rhs_dilation": (2, 2)}, "kernel-dilated"),
])
def test_transposed_convolutions_it_cannot_decompose_are_refused(params: dict[str, object], reason: str) -> None:
    def reference(x, w):  # type: ignore[no-untyped-def]
        return lax.conv_general_dilated(x, w, lhs_dilation=(2, 2), dimension_numbers=_numbers(2), precision=_HI,
                                        **params)  # type: ignore[arg-type]

    found = _match(reference, (2, 4, 8, 8), (8, 4, 3, 3))
    assert isinstance(found, str) and reason in found


def test_a_transposed_convolution_plans_its_phases_convolution() -> None:
    def reference(x, w):  # type: ignore[no-untyped-def]
        y = lax.conv_general_dilated(x, w, (1, 1), [(2, 2)] * 2, lhs_dilation=(2, 2), dimension_numbers=_numbers(2),
                                     precision=_HI)
        return jnp.tanh(y)

    found = _match(reference, (2, 4, 8, 8), (8, 4, 4, 4))
    assert not isinstance(found, str)
    assert found.phases == Phases((2, 2), (2, 2), (2, 2))
    # 4 phases x 8 channels, a 3 x 3 window over the input padded by one, 8 x 8 outputs a phase.
    assert (found.o, found.taps, found.padded, found.out_spatial) == (32, (3, 3), (10, 10), (8, 8))
    assert not found.tileable and found.stats is None
    assert found.tile_tail  # elementwise: the kernel runs it on each step's planes, after the interleave


@pytest.mark.parametrize(("axes", "local"), [((4,), True), ((1,), True), ((2,), False), ((0,), False)])
def test_the_tail_runs_on_a_steps_planes_only_when_it_reduces_within_a_plane(axes: tuple[int, ...], local: bool) -> None:
    def reference(x, w):  # type: ignore[no-untyped-def]
        y = lax.conv_general_dilated(x, w, (1, 1, 1), [(2, 2)] * 3, lhs_dilation=(2, 2, 2),
                                     dimension_numbers=_numbers(3), precision=_HI)
        return y - jnp.mean(y, axis=axes, keepdims=True)

    found = _match(reference, (2, 4, 4, 4, 4), (8, 4, 4, 4, 4))
    assert not isinstance(found, str) and found.tile_tail is local
