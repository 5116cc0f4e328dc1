"""Statics stay arguments: a literal that is a float static is written as its name by every emitter that
serves GEMM-and-epilogue computations, so a kernel is right for any value its caller passes."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from jaxbench.task import load_task
from maxkernel.analysis import analyze_task
from maxkernel.analysis.program import trace_program
from maxkernel.analysis.statics import used_statics
from maxkernel.rewrites.emit import emit_function
from maxkernel.rules.strategy import propose_strategies, render

GET_INPUTS = '''import jax
import jax.numpy as jnp


def get_inputs(key, *, m, k, n):
    kx, kw, kb = jax.random.split(key, 3)
    x = jax.random.normal(kx, (m, k), jnp.float32)
    w = jax.random.normal(kw, (n, k), jnp.float32) * k ** -0.5
    b = jax.random.normal(kb, (n,), jnp.float32)
    return (x, w, b), {"alpha": 1.5, "slope": 0.1}
'''

SCALED_LEAKY = GET_INPUTS + '''

def reference(x, w, b, *, alpha, slope):
    h = jnp.einsum("mk,nk->mn", x, w, precision=jax.lax.Precision.HIGHEST) + b
    h = h * alpha
    return jnp.where(h > 0, h, slope * h)
'''

BRANCHING = GET_INPUTS + '''

def reference(x, w, b, *, alpha, slope):
    h = jnp.einsum("mk,nk->mn", x, w, precision=jax.lax.Precision.HIGHEST) + b
    if alpha > 1.7:  # the static picks the code: the program is a specialization
        h = jnp.tanh(h)
    return h * alpha + slope
'''

FOLDED = GET_INPUTS + '''

def reference(x, w, b, *, alpha, slope):
    h = jnp.einsum("mk,nk->mn", x, w, precision=jax.lax.Precision.HIGHEST) + b
    return h * (alpha / 3.0) + slope  # alpha reaches the literal through arithmetic no emitter writes back
'''


def _task(root: Path, name: str, reference: str, statics: bool = True):  # type: ignore[no-untyped-def]
    folder = root / name
    folder.mkdir(parents=True)
    spec = {"id": name, "name": name, "category": "matmul",
            "description": "a GEMM with a bias, then an epilogue that reads two float statics",
            "dtype": "float32", "tolerance": {"atol": 1e-3, "rtol": 1e-3},
            "sizes": {"cpu": {"m": 256, "k": 512, "n": 256}, "full": {"m": 1024, "k": 2048, "n": 1024}},
            "free": {"m": {}}}
    if statics:
        spec["statics"] = {"alpha": {"min": 0.5, "max": 4.0}, "slope": {"min": 0.01, "max": 0.5}}
    (folder / "task.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    (folder / "reference.py").write_text(reference)
    return load_task(folder)


def test_literals_that_are_statics_are_written_as_their_names(tmp_path: Path) -> None:
    program = trace_program(_task(tmp_path, "scaled_leaky", SCALED_LEAKY), "cpu")
    assert used_statics(program) == ["alpha", "slope"]
    named = emit_function(program, "_f", statics=True)
    assert named.splitlines()[0] == "def _f(x, w, b, *, alpha, slope):"
    assert "* alpha" in named and "slope *" in named and "1.5" not in named
    literal = emit_function(program, "_f")  # an emitter that does not take statics writes the values
    assert "1.5" in literal and "alpha" not in literal


@pytest.mark.parametrize("name, source", [("branching", BRANCHING), ("folded", FOLDED)])
def test_a_static_that_is_not_a_plain_value_marks_nothing(tmp_path: Path, name: str, source: str) -> None:
    """A static that picks a branch, or reaches a literal through arithmetic, leaves every literal a value:
    naming some and not others would give code that is wrong at other values all the same."""
    program = trace_program(_task(tmp_path, name, source), "cpu")
    assert used_statics(program) == []
    assert "*, " not in emit_function(program, "_f", statics=True).splitlines()[0]


@pytest.mark.slow
@pytest.mark.parametrize("target", ["cpu", "tpu-v6e", "gpu-h100"])
def test_every_gemm_epilogue_candidate_takes_the_statics_as_given(tmp_path: Path, target: str) -> None:
    """Each strategy proposed for a GEMM with a static-reading epilogue (the general fused sketch with and
    without its hoisted prologue too) is judged correct with the statics redrawn (the evaluator's
    ``correct_redrawn_statics``)."""
    from jaxbench.evaluate import EvalConfig, Evaluator

    task = _task(tmp_path, "scaled_leaky", SCALED_LEAKY)
    strategies = [s for s in propose_strategies(task, analyze_task(task, target), target) if s.kind != "reference"]
    assert strategies
    if target == "tpu-v6e":
        assert "template:fused_grid" in {s.name for s in strategies}
    ev = Evaluator(config=EvalConfig(timing=False, timeout_s=300, unseen_size=True))
    try:
        for strategy, params in [(s, p) for s in strategies
                                 for p in ([{}, {"hoist": True}] if s.name == "template:fused_grid" else [{}])]:
            report = ev.evaluate(task, render(task, strategy, params))
            assert report.passed, (strategy.name, report.reason)
            redrawn = [c for c in report.checks if c.name == "correct_redrawn_statics"]
            assert redrawn and redrawn[0].passed, (strategy.name, redrawn)
    finally:
        ev.close()


def test_a_statics_variant_keeps_the_declared_ranges_under_the_new_names(tmp_path: Path) -> None:
    from jaxbench.variants import derive

    task = _task(tmp_path, "scaled_leaky", SCALED_LEAKY)
    seen = set()
    for seed in range(12):
        folder = derive(task, "statics", tmp_path / f"v{seed}", seed=seed)
        spec = yaml.safe_load((folder / "task.yaml").read_text())
        source = (folder / "reference.py").read_text()
        declared = set(spec.get("statics") or {})
        if "ALPHA_CONST" in source:  # folded into module constants: nothing left to redraw
            assert declared == set()
            seen.add("folded")
        else:
            assert len(declared) == 2 and declared.isdisjoint({"alpha", "slope"})
            assert all(f"{name}" in source for name in declared)
            seen.add("renamed")
    assert seen == {"folded", "renamed"}


def test_task_check_refuses_a_declared_static_the_output_does_not_follow(tmp_path: Path) -> None:
    """A declared static must move the output past the tolerance somewhere in its range: one that does not
    (an ``eps`` beside values of order one) makes a check that cannot fail, and ``task_check`` says so."""
    import jax

    from jaxbench.task_check import check_statics

    task = _task(tmp_path, "scaled_leaky", SCALED_LEAKY)
    args, static = task.get_inputs(jax.random.key(0), "cpu")
    out = jax.jit(lambda *a: task.reference(*a, **static))(*args)
    assert check_statics(task, args, static, out) == []
    spec = yaml.safe_load((task.path / "task.yaml").read_text())
    spec["statics"]["slope"] = {"min": 0.1, "max": 0.1000001}  # drawn within a millionth: the output cannot tell
    (task.path / "task.yaml").write_text(yaml.safe_dump(spec))
    problems = check_statics(load_task(task.path), args, static, out)
    assert len(problems) == 1 and "static slope is redrawn" in problems[0], problems
