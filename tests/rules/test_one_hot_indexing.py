"""Gathers and scatters of a few elements per row along a short axis become one-hot selects that compute
the same values, whatever way the indexing is spelled; indexing that is not of that shape is left alone."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from maxkernel.analysis.program import Program, ProgramBuilder
from maxkernel.rewrites import apply_rewrites
from maxkernel.rewrites.numeric import evaluate_nodes


def _program(fn, *shapes) -> Program:  # type: ignore[no-untyped-def]
    specs = [jax.ShapeDtypeStruct(s, d) for s, d in shapes]
    return ProgramBuilder().build(jax.make_jaxpr(fn)(*specs), [f"a{i}" for i in range(len(specs))])


def _run(program: Program, args: list[np.ndarray]) -> list[np.ndarray]:
    env = evaluate_nodes(program.nodes, dict(zip(program.inputs, args)))
    return [np.asarray(env[o]) if o in env else np.asarray(o.value) for o in program.outputs]


def _rewritten(fn, shapes, args):  # type: ignore[no-untyped-def]
    program = _program(fn, *shapes)
    result = apply_rewrites(program, ["one_hot_indexing"])
    prims = [n.prim for n in result.program.nodes]
    for got, want in zip(_run(result.program, args), _run(program, args)):
        np.testing.assert_array_equal(got, want)
    return result, prims


def router(scores, bias):  # type: ignore[no-untyped-def]
    _, idx = jax.lax.top_k(scores + bias, 4)
    picked = jnp.take_along_axis(scores, idx, axis=-1)
    picked = picked / jnp.sum(picked, axis=-1, keepdims=True)
    return jnp.zeros_like(scores).at[jnp.arange(scores.shape[0])[:, None], idx].set(picked)


def test_a_router_gathers_and_scatters_by_one_hot_and_computes_the_same() -> None:
    rng = np.random.default_rng(0)
    scores = rng.random((64, 32), np.float32)
    bias = rng.normal(size=(32,)).astype(np.float32)
    result, prims = _rewritten(router, [((64, 32), jnp.float32), ((32,), jnp.float32)], [scores, bias])
    assert result.sites == {"one_hot_indexing": 2}
    assert "gather" not in prims and "scatter" not in prims and "top_k" in prims


def test_batched_spellings_and_scatter_add_with_repeated_indices() -> None:
    def spelled(x, idx, upd):  # type: ignore[no-untyped-def]
        taken = jnp.take_along_axis(x, idx, axis=-1, mode="clip")  # a 3-D operand, indices clamped
        put = jnp.put_along_axis(x, idx, upd, axis=-1, inplace=False)
        added = x.at[jnp.arange(x.shape[0])[:, None, None], jnp.arange(x.shape[1])[None, :, None], idx].add(upd)
        return taken, put, added

    rng = np.random.default_rng(1)
    x = rng.normal(size=(4, 6, 16)).astype(np.float32)
    idx = rng.integers(-20, 20, size=(4, 6, 3)).astype(np.int32)  # out of range and repeated indices
    idx[0, 0] = [5, 5, 5]
    upd = rng.normal(size=(4, 6, 3)).astype(np.float32)
    shapes = [((4, 6, 16), jnp.float32), ((4, 6, 3), jnp.int32), ((4, 6, 3), jnp.float32)]
    program = _program(spelled, *shapes)
    result = apply_rewrites(program, ["one_hot_indexing"])
    want, got = _run(program, [x, idx, upd]), _run(result.program, [x, idx, upd])
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_allclose(got[2], want[2], rtol=1e-6, atol=1e-6)  # the duplicates add in another order
    # put_along_axis with repeated indices: a set keeps one of them (XLA leaves which unspecified), so only
    # rows without repeats are compared exactly.
    distinct = np.array([[len(set(r)) == 3 for r in row] for row in idx])
    np.testing.assert_array_equal(got[1][distinct], want[1][distinct])
    assert result.sites == {"one_hot_indexing": 3}
    assert not {"gather", "scatter", "scatter-add"} & {n.prim for n in result.program.nodes}


def test_a_scatter_with_batching_dimensions() -> None:
    numbers = jax.lax.ScatterDimensionNumbers(update_window_dims=(), inserted_window_dims=(1,),
                                              scatter_dims_to_operand_dims=(1,), operand_batching_dims=(0,),
                                              scatter_indices_batching_dims=(0,))

    def batched(x, idx, upd):  # type: ignore[no-untyped-def]
        return jax.lax.scatter(x, idx[..., None], upd, numbers, mode="promise_in_bounds")

    rng = np.random.default_rng(2)
    x = rng.normal(size=(8, 24)).astype(np.float32)
    idx = np.stack([rng.permutation(24)[:3] for _ in range(8)]).astype(np.int32)
    upd = rng.normal(size=(8, 3)).astype(np.float32)
    result, prims = _rewritten(batched, [((8, 24), jnp.float32), ((8, 3), jnp.int32), ((8, 3), jnp.float32)],
                               [x, idx, upd])
    assert result.sites == {"one_hot_indexing": 1} and "scatter" not in prims


@pytest.mark.parametrize("case", ["long_axis", "rows_not_an_iota", "windows"])
def test_near_misses_are_left_alone(case: str) -> None:
    if case == "long_axis":  # a gather along an axis too long for one pass per index
        fn = lambda x, i: jnp.take_along_axis(x, i, axis=-1)  # noqa: E731
        shapes = [((4, 8192), jnp.float32), ((4, 2), jnp.int32)]
    elif case == "rows_not_an_iota":  # the rows are an input (a permutation): no row is known to own its writes
        fn = lambda x, rows, i, u: x.at[rows[:, None], i].set(u)  # noqa: E731
        shapes = [((8, 16), jnp.float32), ((8,), jnp.int32), ((8, 2), jnp.int32), ((8, 2), jnp.float32)]
    else:  # a gather of windows (a dynamic slice per row), not of single elements
        fn = lambda x, i: jax.vmap(lambda r, s: jax.lax.dynamic_slice(r, (s,), (4,)))(x, i)  # noqa: E731
        shapes = [((8, 16), jnp.float32), ((8,), jnp.int32)]
    result = apply_rewrites(_program(fn, *shapes), ["one_hot_indexing"])
    assert not result.sites
