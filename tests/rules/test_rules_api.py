"""The rules brain's API end to end: strategies and the debugger, and the engine (an Auto session on the
actors) with the real evaluator: the reference returned when nothing beats it, the TPU order."""

from __future__ import annotations

import pytest
from pathlib import Path

from jaxbench import static_checks
from jaxbench.report import EvalReport
from jaxbench.task import load_task
from maxkernel.analysis import analyze_task
from maxkernel.rules import fix_known_error, propose_strategies, render


def _engine(evaluator, task: str, **kwargs):  # type: ignore[no-untyped-def]
    import asyncio

    from actors.config import ActorConfig
    from actors.services import Services
    from orchestrators.auto import run_auto

    services = Services(ActorConfig(remember=False), evaluator=evaluator)
    try:
        return asyncio.run(run_auto(task, services=services, **kwargs))
    finally:
        services.store.close()
        services.memory.close()


def test_strategies_put_work_removing_rewrites_first_and_the_reference_last() -> None:
    task = load_task("21k_Gemm_Divide_Sum_Scaling")
    strategies = propose_strategies(task, analyze_task(task))
    assert strategies[0].name == "rewrite:sum_after_matmul" and strategies[0].kind == "rewrite"
    assert strategies[-1].kind == "reference"
    assert any(s.kind == "template" and s.space for s in strategies)
    for s in strategies:
        assert static_checks.scan(render(task, s))[0] == []


def test_a_template_that_raises_costs_its_own_strategy_and_no_other(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # A template's defect (an IndexError in the general rules on a variant) ended the whole planner, so the
    # session tried nothing; now that template is left out and the others are proposed as before.
    from maxkernel.rules.strategy import templates_for

    task = load_task("12p_RMSNorm")
    analysis = analyze_task(task, "tpu-v6e")
    before = [s.name for s in propose_strategies(task, analysis, "tpu-v6e")]
    broken = next(t for t in templates_for("tpu-v6e") if f"template:{t.name}" in before)

    def raises(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise IndexError("tuple index out of range")

    monkeypatch.setattr(type(broken), "applies", raises)
    after = [s.name for s in propose_strategies(task, analysis, "tpu-v6e")]
    assert after == [n for n in before if n != f"template:{broken.name}"] and after[-1] == "reference"


def test_fix_known_error_strips_interpret_and_knows_when_it_cannot_help() -> None:
    report = EvalReport(task="t", status="rejected", reason="x")
    fixed = fix_known_error("y = pl.pallas_call(k, grid=(1,), interpret=True)(x)\n", report)
    assert fixed == "y = pl.pallas_call(k, grid=(1,))(x)\n"
    assert fix_known_error("def kernel(x):\n    return x\n", report) is None


CENTRED_YAML = """id: centred_columns
name: Centred_Columns
category: normalization
description: Each value of x [rows, cols] float32 minus the mean of its column.
dtype: float32
tolerance: {atol: 1.0e-5, rtol: 1.0e-5}
sizes:
  cpu: {rows: 256, cols: 512}
  full: {rows: 4096, cols: 4096}
"""

CENTRED_REFERENCE = """import jax
import jax.numpy as jnp


def get_inputs(key, *, rows, cols):
    return (jax.random.normal(key, (rows, cols), jnp.float32),), {}


def reference(x):
    return x - jnp.mean(x, axis=0, keepdims=True)
"""


@pytest.mark.slow
def test_the_engine_returns_the_reference_and_says_so_when_nothing_beats_it(evaluator, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from orchestrators.auto import AutoBudget

    folder = tmp_path / "centred_columns"
    folder.mkdir()
    (folder / "task.yaml").write_text(CENTRED_YAML)
    (folder / "reference.py").write_text(CENTRED_REFERENCE)
    task = load_task(folder)  # statistics over rows: no rewrite or template applies
    assert [s.name for s in propose_strategies(task, analyze_task(task, "cpu"))] == ["reference"]
    result = _engine(evaluator, str(folder), budget=AutoBudget(time_s=30))
    assert not result.beat_reference and result.best_strategy == "reference" and result.confirmed_speedup is None
    assert "nothing beat the reference" in result.note and result.status == "scored"
    assert "tried nothing" in result.note and result.claim == "at par" and result.verdict == result.note
    # The remembered note and the report read their figures from the same event log.
    from maxkernel.config import load_settings
    from memory import Store
    from orchestrators.report import gather

    with Store.open(load_settings().resolved_store_url) as store:
        assert gather(store, result.session_id).facts["evaluations"] == result.evaluations
        note = store.notes([result.remembered_note])[result.remembered_note].text
    assert f", {result.evaluations} evaluations: " in note
    assert result.best_report is not None and result.best_report.label == "reference-equivalent"
    assert result.best_source is not None and "return reference(*args, **static)" in result.best_source
    assert {t.role for t in result.trials} == {"baseline"} and result.first_correct_at is None


@pytest.mark.slow
def test_tpu_target_works_pallas_first_and_ranks_by_the_cost_model(evaluator) -> None:  # type: ignore[no-untyped-def]
    from orchestrators.auto import AutoBudget

    wide = load_task("21k_Gemm_Divide_Sum_Scaling")
    names = [s.name for s in propose_strategies(wide, analyze_task(wide, "tpu-v5e"), "tpu-v5e")]
    assert "template:rowblock" not in names  # the whole weight cannot sit in VMEM
    task = load_task("44k_Matmul_Divide_GELU")  # a rewrite (erfc as 1 - erf) beside three Pallas strategies
    strategies = propose_strategies(task, analyze_task(task, "tpu-v5e"), "tpu-v5e")
    assert [s.kind for s in strategies] == ["rewrite", "template", "template", "template", "reference"]
    # the expert sketch first, the general rules last among the Pallas strategies
    assert [s.name for s in strategies if s.kind == "template"] == ["template:tpu_gemm", "template:matmul_epilogue",
                                                                    "template:fused_grid"]
    result = _engine(evaluator, task.id, target="tpu-v5e", budget=AutoBudget(time_s=60))
    drafts = [t.strategy for t in result.trials if t.role == "draft"]
    kinds = ["rewrite" if d.startswith("rewrite:") else "template" for d in drafts]
    assert drafts[0] == "template:tpu_gemm" and kinds == sorted(kinds, reverse=True)  # on a TPU target, Pallas first
    assert result.beat_reference and result.best_report is not None
    assert result.best_report.basis == "modelled" and result.best_report.model is not None
    assert result.confirmation == "modelled, deterministic" and "confirm" not in {t.role for t in result.trials}


def test_a_rewrite_says_how_much_of_the_reference_s_work_it_keeps() -> None:
    from maxkernel.rewrites import propose_rewrites

    found = {tuple(r.names): r.work_ratio for r in propose_rewrites(load_task("21k_Gemm_Divide_Sum_Scaling"), "cpu", "tpu-v6e")}
    assert found[("sum_after_matmul",)] is not None and found[("sum_after_matmul",)] < 0.01  # the matmul became a matvec
    kept = {tuple(r.names): r.work_ratio for r in propose_rewrites(load_task("13p_Cross_Entropy"), "cpu", "tpu-v6e")}
    assert all(ratio is not None and ratio > 0.9 for ratio in kept.values())


def test_every_combination_of_the_matmul_template_s_blocks_fits_vmem() -> None:
    """The tuner tries every combination of a space's lists: the largest of each together must fit too."""
    import itertools

    from maxkernel.analysis import analyze_task
    from maxkernel.templates.base import TPU_VMEM_BUDGET
    from maxkernel.templates.matmul import MATMUL, tile_vmem_bytes

    task = load_task("19k_Matmul_Subtract_Multiply_ReLU")
    space = MATMUL.space(task, analyze_task(task, "tpu-v6e"), "tpu-v6e").space
    combos = list(itertools.product(space["block_m"], space["block_n"], space["block_k"]))
    assert len(combos) > 1 and all(tile_vmem_bytes(*c) <= TPU_VMEM_BUDGET for c in combos)
