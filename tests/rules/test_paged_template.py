"""The paged decode template: where it applies, its tuned space on TPU, and that its 6p kernel lowers for
v5e and is modelled at least as fast as JAX's paged_attention (the expert baseline) on the same model.

Its correctness in TPU interpret mode, at a check size, is tested in tests/targets/test_paged_check.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from jaxbench.task import load_task
from maxkernel.analysis import analyze_task
from maxkernel.rules.strategy import Strategy, propose_strategies, render
from maxkernel.targets.lowering import validate_tpu
from maxkernel.targets.model import model_candidate
from maxkernel.templates.paged import PAGED_ATTENTION

EXPERT = Path(__file__).resolve().parents[2] / "benchmarks" / "experts" / "6p_Paged_Attention.py"


@pytest.fixture(scope="module")
def paged():  # type: ignore[no-untyped-def]
    return load_task("6p_Paged_Attention")


def _names(task, target: str) -> list[str]:  # type: ignore[no-untyped-def]
    return [s.name for s in propose_strategies(task, analyze_task(task, target), target)]


@pytest.mark.slow
def test_offered_on_tpu_targets_only_before_the_general_templates(paged) -> None:  # type: ignore[no-untyped-def]
    names = _names(paged, "tpu-v5e")
    templates = [n for n in names if n.startswith("template:")]
    assert templates[0] == "template:paged_attention"
    assert "template:paged_attention" not in _names(paged, "cpu")


def test_other_attention_tasks_are_not_paged_decode() -> None:
    for task_id in ("1p_Flash_Attention", "7p_Ragged_Paged_Attention"):
        task = load_task(task_id)
        reason = PAGED_ATTENTION.applies(task, analyze_task(task, "tpu-v5e"))
        assert reason is not None and "inputs are not (q, k pages, v pages, page table, lengths)" in reason


def test_tpu_space_is_the_dividing_power_of_two_blocks(paged) -> None:  # type: ignore[no-untyped-def]
    space = PAGED_ATTENTION.space(paged, analyze_task(paged, "tpu-v5e"), "tpu-v5e")
    # 256 pages a sequence at full size, 16 tokens a page: every block of >= 128 keys that divides it.
    assert space.space == {"pages_per_block": [8, 16, 32, 64, 128, 256]}
    assert space.defaults == {"pages_per_block": 256}


@pytest.mark.slow
def test_rendered_kernel_lowers_for_v5e_and_is_modelled_at_least_as_fast_as_the_expert(paged) -> None:  # type: ignore[no-untyped-def]
    source = render(paged, Strategy(name="template:paged_attention", kind="template", target="tpu-v5e",
                                    params={"pages_per_block": 128}))
    assert "interpret" not in source and "preferred_element_type=jnp.float32" in source
    lowered = validate_tpu(source, paged, "v5e")
    assert lowered.ok, lowered.reason
    ours = model_candidate(source, paged, "v5e")
    expert = model_candidate(EXPERT.read_text(), paged, "v5e")
    assert ours.time_ms <= expert.time_ms
    # Only the pages below each length are copied: fewer bytes than the expert's whole 64-page blocks.
    assert ours.bytes < expert.bytes


def test_an_op_after_the_paged_attention_is_refused_not_left_out(tmp_path: Path) -> None:
    # The suite's paged decode with its output passed through one more op (a variant of 6p): the template and
    # the paged rewrite matched it and left the op out, so both candidates were incorrect.
    from jaxbench.task import list_tasks, load_task
    from jaxbench.variants import derive
    from maxkernel.templates.paged import analyse

    paged = next(t for t in list_tasks() if t.id.startswith("6p_"))
    assert not isinstance(analyse(paged, "cpu"), str)
    variant = load_task(derive(paged, "extra_op", tmp_path, seed=1))
    found = analyse(variant, "cpu")
    assert isinstance(found, str) and found.endswith("after the attention (the paged kernel ends at its result)")
