"""Emitted code reads next to its reference: the reference's names, names that say what a value is, each
rewrite stated where it acts, and still exactly the reference's computation."""

from __future__ import annotations

import pytest
import functools
import importlib.util
import re
import types
from pathlib import Path

import jax
import numpy as np

from jaxbench import static_checks
from jaxbench.task import load_task
from maxkernel.analysis.program import ProgramBuilder
from maxkernel.rewrites import render_rewrite
from maxkernel.rewrites.source import jax_candidate

MACHINE_NAMES = re.compile(r"\b(t1\d{4}|v\d+)\b")

REFERENCE = '''
import jax
import jax.numpy as jnp


def reference(x, w):
    scores = jnp.dot(x, w)
    probs = jax.nn.softmax(scores, axis=-1)
    h = probs * 2.0
    y = h + 1.0
    h = y * 3.0
    sum = jnp.sum(h, axis=-1)
    return sum + y[:, 0] + x[:, 0]
'''


def _load(source: str) -> types.ModuleType:
    module = types.ModuleType("candidate")
    exec(compile(source, "candidate.py", "exec"), module.__dict__)
    return module


def _reference(tmp_path: Path) -> types.ModuleType:
    path = tmp_path / "reference.py"
    path.write_text(REFERENCE)
    spec = importlib.util.spec_from_file_location("names_reference", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_values_keep_the_reference_names_and_the_rest_say_what_they_are(tmp_path: Path) -> None:
    ref = _reference(tmp_path)
    x, w = jax.random.normal(jax.random.key(0), (6, 5)), jax.random.normal(jax.random.key(1), (5, 7))
    program = ProgramBuilder().build(jax.make_jaxpr(ref.reference)(x, w), ["x", "w"]).dce()
    source = jax_candidate({"cpu": program}, "names")
    for line in ("scores = jax.lax.dot_general(x, w", "probs = ", "y = h + 1.0", "h = y * 3.0"):
        assert line in source, source
    assert "row_max = jnp.max(" in source and "row_sum = jnp.sum(" in source  # softmax's own steps
    assert "sum_ = jnp.sum(h, axis=(1,))" in source  # a builtin's name is never shadowed
    assert not MACHINE_NAMES.search(source), source
    assert static_checks.scan(source)[0] == []
    # A name is reused only once its value is dead: y is read by the return after h is rebound.
    np.testing.assert_array_equal(np.asarray(_load(source).kernel(x, w)), np.asarray(ref.reference(x, w)))


def test_a_rewrite_is_stated_where_it_acts_and_dimensions_are_named() -> None:
    task = load_task("21k_Gemm_Divide_Sum_Scaling")
    source = render_rewrite(task, ["sum_after_matmul"])
    body = source.split("def _computation(x, weight, *, scaling_factor):")[1]  # the static stays an argument
    assert "* scaling_factor" in body and "1.5" not in body, body
    comment = body.index("# sum_after_matmul: a sum over a matmul's output axis")
    assert comment < body.index("jnp.sum(weight, axis=(0,))") < body.index("jax.lax.dot_general(")
    assert re.search(r"\n    s = jax\.lax\.broadcast_in_dim\(", body), body  # the reference's `s = jnp.sum(...)`
    assert not MACHINE_NAMES.search(body), body
    args, static = task.get_inputs(jax.random.key(2))
    got = jax.jit(functools.partial(_load(source).kernel, **static))(*args)
    want = jax.jit(functools.partial(task.reference, **static))(*args)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-3)


def test_input_dimensions_are_read_once_into_named_locals() -> None:
    # 24k's batch differs from its other sizes, so the dimension takes its size parameter's name, and the
    # code runs at another batch.
    task = load_task("24k_Matmul_Scale_ResidualAdd_Clamp_LogSumExp_Mish")
    source = render_rewrite(task, ["dead_code"])
    assert "\n    batch = x.shape[0]\n" in source and "(batch, 1)" in source, source
    small = task.with_size("small", {**task.size("cpu"), "batch": 5})
    args, static = small.get_inputs(jax.random.key(4), "small")
    got = jax.jit(functools.partial(_load(source).kernel, **static))(*args)
    want = jax.jit(functools.partial(task.reference, **static))(*args)
    assert got.shape == want.shape == (5, 1)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_a_mean_divides_by_the_dimensions_it_summed_not_by_the_traced_count() -> None:
    # 31k's batch-norm statistics average over the batch: a traced `/ 1024.0` would be wrong at another batch.
    task = load_task("31k_Gemm_BatchNorm_GELU_ReLU")
    source = render_rewrite(task, ["cheaper_activations"])
    assert "/ 1024.0" not in source and re.search(r"mean = \w+ / x_dim0", source), source
    small = task.with_size("small", {**task.size("cpu"), "batch": 40})
    args, static = small.get_inputs(jax.random.key(5), "small")
    got = jax.jit(functools.partial(_load(source).kernel, **static))(*args)
    want = jax.jit(functools.partial(task.reference, **static))(*args)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-4)
