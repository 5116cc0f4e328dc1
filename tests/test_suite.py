"""Every JaxBench task is sound and its own reference passes the full evaluator."""

from __future__ import annotations

import pytest

from support import reference_candidate
from jaxbench.task import SUITE_DIR, list_tasks
from jaxbench.task_check import check_task

TASK_IDS = [t.id for t in list_tasks()]


def test_the_suite_has_fifty_tasks_with_unique_ids_in_order():
    assert len(TASK_IDS) == 50
    assert len(set(TASK_IDS)) == 50
    numbers = [int("".join(c for c in tid.split("_")[0] if c.isdigit())) for tid in TASK_IDS]
    assert numbers == list(range(1, 51))
    for tid in TASK_IDS:
        assert (SUITE_DIR / tid / "task.yaml").is_file()
        tier = tid.split("_")[0][-1]
        assert tier == ("p" if int(tid.split("_")[0][:-1]) <= 17 else "k")


# The fast loop checks every fifth task (production kernels and fused chains alike); CI's slow tier the rest.
SOUNDNESS_CASES = [tid if i % 5 == 0 else pytest.param(tid, marks=pytest.mark.slow) for i, tid in enumerate(TASK_IDS)]


def test_a_suite_task_is_named_by_its_id_or_by_the_number_that_starts_it() -> None:
    from jaxbench.task import TaskError, load_task

    assert load_task("8p").id == load_task("8p_GEMM").id == "8p_GEMM"
    assert load_task("1p").id == "1p_Flash_Attention"  # not 10p: the number is followed by its underscore
    with pytest.raises(TaskError, match="no such suite task"):
        load_task("9")


@pytest.mark.parametrize("task_id", SOUNDNESS_CASES)
def test_task_is_sound_and_its_reference_passes_the_evaluator(quick_evaluator, task_id):
    from jaxbench.task import load_task

    task = load_task(task_id)
    check = check_task(task, timing=False)
    assert check.ok, check.problems
    if task.spec.dtype == "float32":
        assert not check.notes, check.notes  # tolerance must catch a silent drop to bf16
    report = quick_evaluator.evaluate(task, reference_candidate(task_id))
    assert report.status == "ok", report.reason
    assert report.correct and report.label == "reference-equivalent"
