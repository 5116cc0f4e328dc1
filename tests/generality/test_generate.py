"""The task generator: the committed mix holds for every seed, a seed always draws the same tasks, every
family renders runnable, varied source, and drawn tasks pass task_check with tolerances from TPU numerics."""

from __future__ import annotations

import ast
import random
from collections import Counter
from pathlib import Path

import pytest

from jaxbench.generate import draw, load_mix, plan
from jaxbench.generate.families import FAMILIES


@pytest.mark.parametrize("seed", [0, 1, 7, 2026, 925856864])
def test_mix_quotas_hold_for_forty_draws(seed: int) -> None:
    mix = load_mix()
    slots = plan(seed, 40, mix)
    counts = Counter(s.family for s in slots)
    assert set(counts) == set(mix.families)
    assert min(counts.values()) >= 2
    assert sum(s.dtype == "bfloat16" for s in slots) >= 0.30 * 40
    assert sum(s.decode for s in slots) >= 0.25 * 40
    for s in slots:
        rule = mix.families[s.family].decode
        assert (rule != "never" or not s.decode) and (rule != "always" or s.decode), s


def test_every_family_in_the_mix_is_in_the_grammar() -> None:
    assert set(load_mix().families) == set(FAMILIES)


def test_a_seed_draws_the_same_tasks_and_another_seed_others() -> None:
    first = [(s.family, s.dtype, s.decode, d.source, d.sizes) for s, d in draw(11, 40)]
    again = [(s.family, s.dtype, s.decode, d.source, d.sizes) for s, d in draw(11, 40)]
    other = [(s.family, s.dtype, s.decode, d.source, d.sizes) for s, d in draw(12, 40)]
    assert first == again
    assert first != other


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_family_renders_valid_varied_source(family: str) -> None:
    sources = set()
    for i in range(6):
        for dtype in ("float32", "bfloat16"):
            draft = FAMILIES[family](random.Random(i), dtype, i % 2 == 1)
            tree = ast.parse(draft.source)
            names = {f.name for f in tree.body if isinstance(f, ast.FunctionDef)}
            assert {"get_inputs", "reference"} <= names
            assert set(draft.sizes) == {"cpu", "full"}
            assert draft.dtype == dtype
            sources.add(draft.source)
    assert len(sources) >= 4, f"{family}: draws read alike"


@pytest.mark.slow
def test_drawn_tasks_pass_task_check_with_tolerance_from_tpu_numerics(tmp_path: Path) -> None:
    from jaxbench.generate import write_task
    from jaxbench.task import load_task
    from jaxbench.task_check import check_task

    # an f32 projection at default precision: its reference errs by a bf16 pass under TPU numerics
    errors = {"proj": write_task(FAMILIES["projection"](random.Random(3), "float32", True), tmp_path / "proj", "proj")}
    # an f32 norm has no matmul: its error is float32 rounding
    errors["norm"] = write_task(FAMILIES["norm"](random.Random(3), "float32", False), tmp_path / "norm", "norm")
    errors["dec"] = write_task(FAMILIES["attention_decode"](random.Random(5), "bfloat16", True), tmp_path / "dec", "dec")
    assert errors["proj"] > 1e-4 and errors["norm"] < 1e-5
    floors = {"float32": 1e-5, "bfloat16": 8e-3}
    for name, error in errors.items():
        task = load_task(tmp_path / name)
        result = check_task(task, timing=False)
        # wall-clock limits (reference time, input generation time) are the machine's, not asserted here
        problems = [p for p in result.problems if not p.startswith("get_inputs took")]
        assert not problems, (name, problems)
        assert task.spec.tolerance.rtol >= max(4 * error, floors[task.spec.dtype])
        assert task.spec.tolerance.rtol <= 1.1 * max(4 * error, floors[task.spec.dtype])
