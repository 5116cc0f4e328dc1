"""Sub-pixel decomposition of a transposed convolution, for the TPU convolution template.

A reference writes a stride-``s`` transposed convolution as the stride-1 convolution of the input dilated by
``s`` (``s - 1`` zeros between its elements, ``lhs_dilation``), padded by ``(low, high)``. Of the ``k`` taps
along an axis only those ``t`` with ``(p + t - low) % s == 0`` meet a real input element at output position
``p``, and which ones depends only on the output's phase ``r = p % s``: phase ``r``'s outputs ``p = s m + r``
read input ``m + e`` through tap ``t = s e + low - r``. So the transposed convolution is ``s`` stride-1
convolutions of the undilated input per axis (``s**nd`` in all), one per phase, each with its own taps, and
these are one stride-1 convolution with the phases stacked on the output channels: the window spans every
offset ``e`` some phase reads, a phase's channels hold zeros at the offsets it does not. A depth-to-space
interleave then puts phase ``r``'s output ``m`` at ``s m + r``. No dilated input is built: the convolution
reads ``1 / s**nd`` of the positions the dilated one does.

The functions below are copied into the rendered candidate (their source is the candidate's), so the
tables are derived there from the argument shapes and the reference's strides and padding, at every size.
"""

from __future__ import annotations

import inspect
import itertools
import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp


@dataclass(frozen=True)
class Phases:
    """A transposed convolution's strides and the padding of its dilated input, per spatial axis."""

    strides: tuple[int, ...]
    low: tuple[int, ...]
    high: tuple[int, ...]


def phases_of(pads: tuple[tuple[int, int, int], ...]) -> Phases | None:
    """The decomposition of a convolution whose input is padded by ``pads`` (``lax.pad``: low, high,
    interior per axis), or None when the input is not dilated (a plain convolution)."""
    if all(interior == 0 for _, _, interior in pads):
        return None
    return Phases(tuple(interior + 1 for _, _, interior in pads), tuple(lo for lo, _, _ in pads),
                  tuple(hi for _, hi, _ in pads))


def _phase_taps(k, stride, low):
    """Along one axis of ``k`` taps: the first input offset the phases' common window reads, the window's
    length, and per output phase the original tap at each window position (``k``: none, a zero)."""
    reach = [[((r + t - low) // stride, t) for t in range(k) if (r + t - low) % stride == 0] for r in range(stride)]
    offsets = [e for pairs in reach for e, _ in pairs]
    first, last = min(offsets + [0]), max(offsets + [0])
    table = [[k] * (last - first + 1) for _ in range(stride)]
    for r, pairs in enumerate(reach):
        for e, t in pairs:
            table[r][e - first] = t
    return first, last - first + 1, table


def _phase_weight(w, strides, low):
    """The dilated convolution's kernel [O, C, k...] as one stride-1 kernel [phases x O, C, window...]:
    phase ``r``'s block of ``O`` channels holds the taps that reach its outputs (phases row-major)."""
    o, c = w.shape[:2]
    nd = len(strides)
    ks = w.shape[2:]
    w = jnp.pad(w, ((0, 0), (0, 0)) + ((0, 1),) * nd)  # tap k of each axis: zero
    windows = []
    for a, (s, lo) in enumerate(zip(strides, low)):
        _, length, table = _phase_taps(ks[a], s, lo)
        w = jnp.take(w, jnp.asarray([t for row in table for t in row], jnp.int32), axis=2 + a)
        windows.append(length)
    w = w.reshape((o, c) + tuple(e for s, t in zip(strides, windows) for e in (s, t)))
    order = tuple(2 + 2 * a for a in range(nd)) + (0, 1) + tuple(3 + 2 * a for a in range(nd))
    return w.transpose(order).reshape((math.prod(strides) * o, c) + tuple(windows))


def _phase_input(x, ks, strides, low, high):
    """The undilated input padded for the common window (each phase's outputs ``m = 0, 1, ...`` read
    ``m + first`` onwards), and the transposed convolution's output extents."""
    pads, extents = [], []
    for a, (k, s, lo, hi) in enumerate(zip(ks, strides, low, high)):
        first, length, _ = _phase_taps(k, s, lo)
        size = x.shape[2 + a]
        extent = lo + hi + (size - 1) * s + 1 - k + 1
        per_phase = -(-extent // s)
        pads.append((-first, max(0, per_phase + first + length - 1 - size), 0))
        extents.append(extent)
    return jax.lax.pad(x, jnp.zeros((), x.dtype), ((0, 0, 0), (0, 0, 0)) + tuple(pads)), tuple(extents)


def _phase_live(ks, strides, low):
    """Per output phase (row-major), the window offsets (flattened row-major, as the kernel's shifts) at which
    its kernel is not zero on every axis: the only products the phase needs."""
    tables = [_phase_taps(k, s, lo) for k, s, lo in zip(ks, strides, low)]
    windows = [length for _, length, _ in tables]
    live = []
    for phase in itertools.product(*(range(s) for s in strides)):
        live.append(tuple(
            sum(j * math.prod(windows[a + 1:]) for a, j in enumerate(offset))
            for offset in itertools.product(*(range(w) for w in windows))
            if all(table[r][j] != k for (_, _, table), r, j, k in zip(tables, phase, offset, ks))))
    return tuple(live)


def _depth_to_space(h, strides, extents):
    """[N, phases x O, m...] -> [N, O, s m + r ...]: phase ``r``'s output ``m`` at ``s m + r``, cropped to
    the transposed convolution's extents."""
    n, nd = h.shape[0], len(strides)
    o = h.shape[1] // math.prod(strides)
    m = h.shape[2:]
    h = h.reshape((n,) + tuple(strides) + (o,) + m)
    order = (0, 1 + nd) + tuple(i for a in range(nd) for i in (2 + nd + a, 1 + a))
    h = h.transpose(order).reshape((n, o) + tuple(e * s for e, s in zip(m, strides)))
    return h[(slice(None), slice(None)) + tuple(slice(0, e) for e in extents)]


def kernel_shape(x_spatial: tuple[int, ...], ks: tuple[int, ...], phases: Phases) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The stride-1 convolution the decomposition runs: its window per axis and its padded input's extents."""
    windows, padded = [], []
    for k, s, lo, hi, size in zip(ks, phases.strides, phases.low, phases.high, x_spatial):
        first, length, _ = _phase_taps(k, s, lo)
        per_phase = -(-(lo + hi + (size - 1) * s + 2 - k) // s)
        windows.append(length)
        padded.append(size - first + max(0, per_phase + first + length - 1 - size))
    return tuple(windows), tuple(padded)


PHASES_SOURCE = "\n\n".join(inspect.getsource(f) for f in (_phase_taps, _phase_weight, _phase_input, _phase_live, _depth_to_space)) + "\n"
