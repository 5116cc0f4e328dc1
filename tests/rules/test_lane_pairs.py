"""Interleaved pairs computed on the merged last axis give what the pair-split reference gives, with no
minor axis of 2 left; what is not a pair function (a read of one half elsewhere, a non-elementwise step)
keeps the split."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from maxkernel.analysis.program import ProgramBuilder
from maxkernel.rewrites.lane_pairs import lane_pairs
from support import emitted


def _as_lanes(fn, *args):  # type: ignore[no-untyped-def]
    program = ProgramBuilder().build(jax.make_jaxpr(fn)(*args), [f"a{i}" for i in range(len(args))])
    count = lane_pairs(program)
    return count, program, emitted(program, "lanes")


def _rope_interleaved(x, positions):  # type: ignore[no-untyped-def]  # [batch, heads, dim], one position a row
    d = x.shape[-1]
    ang = positions.astype(jnp.float32)[:, None] / (10000.0 ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
    cos, sin = jnp.cos(ang)[:, None, :], jnp.sin(ang)[:, None, :]
    t = x.astype(jnp.float32).reshape(*x.shape[:-1], -1, 2)
    a, b = t[..., 0], t[..., 1]
    return jnp.stack([a * cos - b * sin, a * sin + b * cos], -1).reshape(x.shape).astype(x.dtype)


def _pair_mix(x, scale):  # type: ignore[no-untyped-def]  # a pair function of another shape: scale per pair
    t = x.reshape(x.shape[0], -1, 2)
    a, b = t[:, :, 0], t[:, :, 1]
    return jnp.stack([jnp.tanh(a + b) * scale, (a - b) * 0.5], axis=2).reshape(x.shape)


@pytest.mark.parametrize("fn,shapes", [(_rope_interleaved, ((4, 3, 128), (4,))), (_pair_mix, ((16, 256), (128,)))])
def test_pairs_on_the_merged_axis_compute_the_reference(fn, shapes) -> None:  # type: ignore[no-untyped-def]
    kx, kp = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, shapes[0], jnp.float32).astype(jnp.bfloat16 if fn is _rope_interleaved else jnp.float32)
    other = (jax.random.randint(kp, shapes[1], 0, 4096) if fn is _rope_interleaved
             else jax.random.normal(kp, shapes[1], jnp.float32))
    count, program, lanes = _as_lanes(fn, x, other)
    assert count == 1
    assert "stack" not in program.primitives()
    # Only the small per-pair values are repeated through a minor axis of 2; nothing of x's size is.
    assert not any(v.shape[-1:] == (2,) and np.prod(v.shape) >= x.size for node in program.nodes for v in node.outs)
    got, expected = lanes(x, other), jax.jit(fn)(x, other)
    (got,) = jax.tree_util.tree_leaves(got)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(expected, np.float32), rtol=1e-2, atol=1e-2)


def test_what_is_not_a_pair_function_keeps_the_split() -> None:
    x = jnp.ones((16, 256))

    def half_escapes(x):  # type: ignore[no-untyped-def]
        t = x.reshape(16, 128, 2)
        a, b = t[:, :, 0], t[:, :, 1]
        return jnp.stack([a * b, a + b], axis=2).reshape(x.shape), a

    def reduces(x):  # type: ignore[no-untyped-def]
        t = x.reshape(16, 128, 2)
        a, b = t[:, :, 0], t[:, :, 1]
        return jnp.stack([a - a.sum(axis=1, keepdims=True), b], axis=2).reshape(x.shape)

    for fn in (half_escapes, reduces):
        program = ProgramBuilder().build(jax.make_jaxpr(fn)(x), ["x"])
        assert lane_pairs(program) == 0 and "stack" in program.primitives()
