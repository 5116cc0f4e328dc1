"""Paged decode kernels under priced = checked: the check size keeps their block configuration with fewer
sequences (a free parameter may go below its cpu value), and the correctness run gets the time its
page-by-page DMAs need in TPU interpret mode.

The task is a small copy of 6p (the suite's reference, small sizes) so that the interpreted runs take
seconds; the kernels are the paged template's, rendered for it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from jaxbench.task import SUITE_DIR, Task, load_task
from maxkernel.evaluation import evaluate_candidate
from maxkernel.rules.strategy import Strategy, render
from maxkernel.targets import check_size
from maxkernel.targets.check_size import CheckSize, check_timeout_s, derive_check_size
from maxkernel.targets.loader import load_candidate
from maxkernel.targets.specs import load_tpu_spec

V5E = load_tpu_spec("v5e")

# Every sequence is longer than one 128-key block (min_len 160 at every size): a check runs two blocks.
# cpu has one kv head, so it is no twin of full (another query block shape): the check size is derived.
PAGED_YAML = """\
id: tgt_paged
name: SmallPagedDecode
category: attention
description: the suite's paged decode attention (6p) at small sizes.
dtype: bfloat16
tolerance: {atol: 2.0e-2, rtol: 2.0e-2}
sizes:
  cpu: {batch: 4, q_heads: 4, kv_heads: 1, head_dim: 128, page_size: 16, pages_per_seq: 16, total_pages: 64,
        min_len: 160}
  full: {batch: 8, q_heads: 8, kv_heads: 2, head_dim: 128, page_size: 16, pages_per_seq: 16, total_pages: 256,
         min_len: 160}
"""


def _paged_task(folder: Path, free: bool) -> Task:
    folder.mkdir(parents=True)
    (folder / "task.yaml").write_text(PAGED_YAML + ("free: {batch: {}}\n" if free else ""))
    (folder / "reference.py").write_text((SUITE_DIR / "6p_Paged_Attention" / "reference.py").read_text())
    return load_task(folder)


@pytest.fixture(scope="module")
def paged_task(tmp_path_factory: pytest.TempPathFactory) -> Task:
    return _paged_task(tmp_path_factory.mktemp("tasks") / "tgt_paged", free=True)


def _template_source(task: Task, pages_per_block: int = 8) -> str:
    strategy = Strategy(name="template:paged_attention", kind="template", target="tpu-v5e",
                        params={"pages_per_block": pages_per_block})
    return render(task, strategy)


# Wrong only when a sequence spans two kv blocks: the running output is not rescaled by the new row max.
def _unrescaled(source: str) -> str:
    broken = source.replace("acc_ref[...] = alpha * acc_ref[...] + pv", "acc_ref[...] = acc_ref[...] + pv")
    assert broken != source
    return broken


def test_free_parameter_goes_below_its_cpu_value(paged_task: Task, tmp_path: Path) -> None:
    source = _template_source(paged_task)
    check = derive_check_size(load_candidate(source), paged_task, V5E, interpreted=True)
    # batch halves to 2 (two grid steps), below cpu's 4; pages_per_seq keeps two 8-page blocks.
    assert check.refusal is None and check.values["batch"] == 2 and check.values["pages_per_seq"] == 16
    assert check.grid_steps == 2 * 2 * 2
    fixed = _paged_task(tmp_path / "fixed", free=False)
    assert derive_check_size(load_candidate(source), fixed, V5E, interpreted=True).values["batch"] == 4


def test_a_block_shrunk_to_fit_a_smaller_page_table_is_another_configuration() -> None:
    # 6p, 256 pages a block: one block a sequence at full size; at 128 pages a sequence the block would
    # shrink to 128 pages (its VMEM slots too), a configuration that is never priced.
    task = load_task("6p_Paged_Attention")
    check = derive_check_size(load_candidate(_template_source(task, 256)), task, V5E)
    assert check.refusal is None and check.values["pages_per_seq"] == 256 and check.values["batch"] == 2
    assert any("pages_per_seq=128: kernel _paged_kernel (pallas_call 1): scratch buffer 0 is (2, 256, 16, 128) "
               "at full size but (2, 128, 16, 128) at the check size" in why for why in check.smaller)


def test_interpreted_operations_follow_the_pages_copied(paged_task: Task) -> None:
    small = derive_check_size(load_candidate(_template_source(paged_task, 8)), paged_task, V5E, True)
    large = derive_check_size(load_candidate(_template_source(paged_task, 16)), paged_task, V5E, True)
    # Each step starts and waits two DMAs per page (k and v): twice the pages a block, about twice the
    # operations a step, on half the kv blocks.
    assert small.interpreted_ops > 8 * small.grid_steps * 2
    assert large.grid_steps == small.grid_steps // 2 and large.interpreted_ops > small.interpreted_ops * 0.8


def test_correctness_timeout_grows_with_interpreted_operations_and_is_capped() -> None:
    light = CheckSize(name="check", values={}, grid_steps=4, interpreted_ops=100)
    heavy = CheckSize(name="check", values={}, grid_steps=16, interpreted_ops=25_000)
    assert check_timeout_s(light, 5, 120.0) == 120.0
    assert check_timeout_s(heavy, 5, 120.0) == pytest.approx(
        check_size.CHECK_BASE_S + 5 * 25_000 * check_size.INTERPRET_OP_S)
    huge = CheckSize(name="check", values={}, grid_steps=16, interpreted_ops=10**7)
    assert check_timeout_s(huge, 5, 120.0) == check_size.CHECK_TIMEOUT_CAP_S + check_size.CHECK_BASE_S


def test_a_check_with_too_many_interpreted_operations_is_refused(paged_task: Task,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(check_size, "CHECK_TIMEOUT_CAP_S", 1.0)
    module = load_candidate(_template_source(paged_task))
    check = derive_check_size(module, paged_task, V5E, interpreted=True)
    assert check.refusal is not None and "interpreted memory operations a run" in check.refusal
    # A check that does not run in TPU interpret mode (the GPU targets' plain interpreter) is not bound by them.
    plain = derive_check_size(module, paged_task, V5E)
    assert plain.refusal is None and plain.interpreted_ops == 0


# --- end to end through evaluate_candidate (sandboxed lowering and check size, TPU interpret mode) ---------


@pytest.mark.slow
def test_paged_template_is_checked_and_priced(paged_task: Task, evaluator) -> None:  # type: ignore[no-untyped-def]
    report = evaluate_candidate(paged_task, _template_source(paged_task), target="tpu-v5e", evaluator=evaluator)
    assert report.status == "ok" and report.correct, report.reason
    assert report.basis == "modelled" and report.speedup is not None and report.label == "pallas-kernel"
    checked = next(c for c in report.checks if c.name == "priced_is_checked")
    assert "batch=2" in checked.detail and "pages_per_seq=16" in checked.detail


@pytest.mark.slow
def test_paged_kernel_wrong_only_past_its_first_block_is_not_ok(paged_task: Task, evaluator) -> None:  # type: ignore[no-untyped-def]
    report = evaluate_candidate(paged_task, _unrescaled(_template_source(paged_task)), target="tpu-v5e",
                                evaluator=evaluator)
    assert report.status == "incorrect" and not report.correct and report.speedup is None
    assert "checked at check(batch=2" in report.reason
