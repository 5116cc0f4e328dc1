"""The jaxpr → JAX source emitter: what it writes computes exactly what the reference computes."""

from __future__ import annotations

import functools
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxbench import static_checks
from jaxbench.task import load_task
from maxkernel.analysis.program import trace_program
from maxkernel.rewrites.emit import EmitError, emittable
from maxkernel.rewrites.source import jax_candidate


def _load(source: str) -> types.ModuleType:
    module = types.ModuleType("candidate")
    exec(compile(source, "candidate.py", "exec"), module.__dict__)
    return module


@pytest.mark.parametrize("task_id", ["12p_RMSNorm", "13p_Cross_Entropy", "4p_Sparse_Attention", "24k_Matmul_Scale_ResidualAdd_Clamp_LogSumExp_Mish",
                                     "7p_Ragged_Paged_Attention", "16p_Mamba2_SSD", "3p_MLA_Attention"])
@pytest.mark.slow
def test_emitted_reference_is_bit_identical(task_id: str) -> None:
    task = load_task(task_id)
    source = jax_candidate({"cpu": trace_program(task, "cpu").dce()}, "round trip")
    assert static_checks.scan(source)[0] == []
    args, static = task.get_inputs(jax.random.key(3))
    expected = jax.jit(functools.partial(task.reference, **static))(*args)
    got = jax.jit(functools.partial(_load(source).kernel, **static))(*args)
    for e, g in zip(jax.tree_util.tree_leaves(expected), jax.tree_util.tree_leaves(got)):
        assert e.dtype == g.dtype and e.shape == g.shape
        np.testing.assert_array_equal(np.asarray(e), np.asarray(g))


def test_integer_division_keeps_integer_semantics() -> None:
    # 4p computes block ids with //: written as true division it would silently become float.
    source = jax_candidate({"cpu": trace_program(load_task("4p_Sparse_Attention"), "cpu").dce()}, "x")
    assert "jax.lax.div(" in source


def test_unsupported_primitive_is_refused_not_mistranslated() -> None:
    from maxkernel.analysis.program import ProgramBuilder

    closed = jax.make_jaxpr(lambda x: jax.lax.cond(x.sum() > 0, jnp.sin, jnp.cos, x))(jnp.ones(4))
    program = ProgramBuilder().build(closed, ["x"])
    assert "cond" in (emittable(program) or "")
    with pytest.raises(EmitError):
        jax_candidate({"cpu": program}, "x")


@pytest.mark.parametrize("task_id", ["12p_RMSNorm", "21k_Gemm_Divide_Sum_Scaling", "13p_Cross_Entropy"])
@pytest.mark.slow
def test_emitted_code_reads_its_shapes_from_its_inputs(task_id: str) -> None:
    # Traced at the cpu size, run at a size drawn from the task's free sizes: no traced shape is baked in.
    task = load_task(task_id)
    _assert_serves_an_unseen_size(task, jax_candidate({"cpu": trace_program(task, "cpu").dce()}, "shape-generic"))


def _assert_serves_an_unseen_size(task, source: str) -> None:
    """The candidate computes what the reference does at a size drawn from the task's free sizes."""
    import random

    unseen = task.with_size("unseen", task.draw_unseen("cpu", random.Random(1)))
    args, static = unseen.get_inputs(jax.random.key(5), "unseen")
    expected = jax.jit(functools.partial(task.reference, **static))(*args)
    got = jax.jit(functools.partial(_load(source).kernel, **static))(*args)
    for e, g in zip(jax.tree_util.tree_leaves(expected), jax.tree_util.tree_leaves(got)):
        assert e.shape == g.shape
        np.testing.assert_allclose(np.asarray(e, np.float32), np.asarray(g, np.float32), rtol=1e-5, atol=1e-5)


def test_specializations_that_differ_refuse_or_fall_back_by_shape() -> None:
    from maxkernel.rewrites.source import size_dispatch

    refusing = size_dispatch({"cpu": ("_a", ((2, 3),)), "full": ("_b", ((4, 3),))}, ["x"])
    module = _load("def _a(x):\n    return 'a'\n\ndef _b(x):\n    return 'b'\n\n" + refusing)
    assert module.kernel(np.zeros((4, 3))) == "b"
    with pytest.raises(ValueError, match=r"serves argument shapes \[\(\(2, 3\),\), \(\(4, 3\),\)\] only"):
        module.kernel(np.zeros((5, 3)))
    falling_back = size_dispatch({"cpu": ("_a", ((2, 3),)), "full": ("_b", ((4, 3),))}, ["x"], otherwise="_a")
    assert _load("def _a(x):\n    return 'a'\n\ndef _b(x):\n    return 'b'\n\n" + falling_back).kernel(np.zeros((5, 3))) == "a"


@pytest.mark.parametrize("task_id", ["3p_MLA_Attention", "16p_Mamba2_SSD"])
@pytest.mark.slow
def test_extents_are_read_as_what_they_follow_at_the_probe_size(task_id: str) -> None:
    # 3p: a batch of one, and heads * v_dim == seq; 16p: batch == groups, and the chunk count seq // 128.
    # At one size each reads as something else; beside the probe size each is read as what it follows.
    from maxkernel.analysis.program import trace_probes

    task = load_task(task_id)
    probes = [probe.dce() for probe in trace_probes(task, "cpu")]
    source = jax_candidate({"cpu": trace_program(task, "cpu").dce()}, "probed", probes)
    assert source.count("def _computation(") == 1
    _assert_serves_an_unseen_size(task, source)


def test_without_a_probe_a_batch_of_one_is_a_literal() -> None:
    # The single-size emitter cannot tell 3p's batch of one from a literal one: what the probe is for.
    task = load_task("3p_MLA_Attention")
    source = jax_candidate({"cpu": trace_program(task, "cpu").dce()}, "one size")
    assert ".reshape((1, seq," in source
