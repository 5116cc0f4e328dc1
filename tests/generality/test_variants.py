"""Metamorphic variants: each kind that keeps the work computes the same values with the same MXU work,
each kind that changes it changes the values (or dtype), and every variant passes task_check."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import jax
import numpy as np
import pytest

from jaxbench.task import load_task
from jaxbench.task_check import check_task
from jaxbench.variants import KEEP, NotApplicable, derive

SOURCE = '''
import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, rows, d_in, d_out):
    k1, k2, k3 = jax.random.split(key, 3)
    x = jax.random.normal(k1, (batch, rows, d_in), jnp.float32)
    w = jax.random.normal(k2, (d_in, d_out), jnp.float32) / d_in ** 0.5
    b = jax.random.normal(k3, (d_out,), jnp.float32)
    return (x, w, b), {"alpha": 0.5}


def reference(x, w, b, *, alpha):
    y = jnp.einsum("brk,kn->brn", x, w) + b
    return jnp.tanh(y) * alpha + x @ w
'''

SPEC = '''id: tiny
name: tiny
category: matmul
description: a small matmul task for variant tests
dtype: float32
tolerance: {atol: 1.0e-3, rtol: 1.0e-3}
sizes:
  cpu: {batch: 4, rows: 64, d_in: 128, d_out: 96}
  full: {batch: 8, rows: 1024, d_in: 1024, d_out: 1024}
free: {rows: {}}
'''


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tasks") / "tiny"
    folder.mkdir()
    (folder / "reference.py").write_text(SOURCE)
    (folder / "task.yaml").write_text(SPEC)
    return folder


def _run(folder: Path) -> tuple[tuple, object, float]:
    from maxkernel.targets.ops import count_ops

    task = load_task(folder)
    args, static = task.get_inputs(jax.random.key(3), "cpu")
    fn = partial(task.reference, **static)
    out = jax.jit(fn)(*args)
    return args, out, count_ops(jax.make_jaxpr(fn)(*args).jaxpr).mxu_flops


@pytest.mark.slow
@pytest.mark.parametrize("kind", [*KEEP, "dtype", "extra_op"])
def test_variant_keeps_or_changes_the_work_as_said(tiny: Path, tmp_path: Path, kind: str) -> None:
    try:
        folder = derive(load_task(tiny), kind, tmp_path, seed=1)
    except NotApplicable as exc:  # every kind applies to this task
        pytest.fail(f"{kind}: {exc}")
    _, base, base_flops = _run(tiny)
    args, out, flops = _run(folder)
    result = check_task(load_task(folder), timing=False)
    assert result.ok, result.problems
    base, out = np.asarray(base), np.asarray(out)
    if kind in KEEP:
        assert flops == base_flops
        if kind == "batch_added":
            assert out.shape == (1, *base.shape)
            out = out[0]
        elif kind == "batch_removed":
            assert out.shape == (base.shape[0] * base.shape[1], *base.shape[2:])
            assert args[0].ndim == 2
            out = out.reshape(base.shape)
        np.testing.assert_allclose(out, base, rtol=1e-5, atol=1e-5)
    elif kind == "dtype":
        assert out.dtype == np.dtype(jax.numpy.bfloat16) and load_task(folder).spec.dtype == "bfloat16"
        assert load_task(folder).spec.tolerance.rtol > load_task(tiny).spec.tolerance.rtol
    else:
        assert flops == base_flops and not np.allclose(out, base, atol=1e-2)
        np.testing.assert_allclose(out, base / (1 + np.exp(-base)), rtol=1e-5, atol=1e-5)


def test_permute_reorders_and_renames_the_arguments(tiny: Path, tmp_path: Path) -> None:
    import ast

    folder = derive(load_task(tiny), "permute", tmp_path, seed=1)
    tree = ast.parse((folder / "reference.py").read_text())
    ref = next(f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == "reference")
    names = [a.arg for a in ref.args.args]
    assert len(names) == 3 and not {"x", "w", "b"} & set(names)
    args, _, _ = _run(folder)
    assert [a.shape for a in args] != [(4, 64, 128), (128, 96), (96,)]


def test_transpose_stores_the_weight_transposed(tiny: Path, tmp_path: Path) -> None:
    folder = derive(load_task(tiny), "transpose", tmp_path, seed=1)
    args, _, _ = _run(folder)
    assert (96, 128) in [a.shape for a in args]
