"""optimize-model end to end on the smallest layer with a tiny budget, and the drop of a breaking region kernel."""

from __future__ import annotations

import pytest
from pathlib import Path

from jaxbench.task import load_task
from maxkernel.evaluation import evaluate_candidate
from maxkernel.extract import extract_task
from orchestrators.model_opt import ModelResult, RegionRow, _judge, amdahl, optimize_model, region_budget, settle

SMALLEST = "mamba2_block"  # three regions


@pytest.mark.slow
def test_optimize_model_writes_a_correct_layer(tmp_path, monkeypatch):
    monkeypatch.setenv("MAXKERNEL_DATA_DIR", str(tmp_path / "data"))
    result = optimize_model(SMALLEST, out=tmp_path, budget_s=30.0, target="cpu")
    assert result.correct and result.kernel_path and result.speedup is not None
    assert [r.index for r in result.regions] == list(range(len(result.regions)))
    assert {r.status for r in result.regions} <= {"kept", "dropped", "no faster kernel", "skipped"}
    assert abs(sum(r.share for r in result.regions) - 1.0) < 1e-6
    report = evaluate_candidate(load_task(SMALLEST), Path(result.kernel_path).read_text(), target="cpu")
    assert report.correct, report.reason


@pytest.mark.slow
def test_a_region_kernel_that_breaks_the_layer_is_dropped(tmp_path):
    layer = load_task(SMALLEST)
    extraction = extract_task(layer, tmp_path, timing=False)
    for info in extraction.regions:
        info.share = 1.0 / len(extraction.regions)
    last = extraction.regions[-1]
    args = ", ".join(f"a{i}" for i in range(len(last.inputs)))
    broken = f"import jax.numpy as jnp\n\n\ndef kernel({args}):\n    return a0 * 0.0 + 1.0\n"
    result = ModelResult(layer=layer.id, target="cpu",
                         regions=[RegionRow(index=r.index, task_id=r.task_id, kind=r.kind, share=r.share, budget_s=0,
                                            status="kept", speedup=2.0) for r in extraction.regions])
    kernels = {last.index: broken}
    report = _judge(layer, extraction, kernels, result, "cpu", evaluate_candidate)
    assert report.correct and kernels == {}
    assert result.regions[-1].status == "dropped" and "breaks the whole layer" in result.regions[-1].note
    # With no region kernel left, the layer handed back is the reference itself, and the result says so.
    source = settle(layer, extraction, kernels, report, result)
    assert result.returned_reference and result.speedup == 1.0 and result.judged_speedup == report.speedup
    assert source.rstrip().endswith("return reference(*args, **static)")
    assert any("no region kernel was kept: the reference itself is returned" in n for n in result.notes)


def test_amdahl_bound_counts_only_kept_regions():
    rows = [RegionRow(index=0, task_id="a", kind="attention", share=0.5, budget_s=1, status="kept", speedup=2.0),
            RegionRow(index=1, task_id="b", kind="matmul", share=0.5, budget_s=1, status="dropped", speedup=4.0)]
    assert abs(amdahl(rows) - 1.0 / (0.25 + 0.5)) < 1e-9


def test_region_budget_shares_what_is_left_among_the_regions_still_to_run():
    from maxkernel.extract.layer import RegionInfo

    hot, warm, cold = (RegionInfo(index=i, task_id=str(i), kind="matmul", path="", nodes=(0, 0), inputs=[],
                                  outputs=[], primitives=[], share=s) for i, s in enumerate((0.6, 0.3, 0.1)))
    seconds, evals = region_budget(hot, [hot, warm, cold], 100.0, 10)
    assert abs(seconds - 60.0) < 1e-9 and evals == 6
    # The hottest session used 20 of its 60 s and 2 evaluations: what is left goes to the two regions
    # still to run, 3:1.
    seconds, evals = region_budget(warm, [warm, cold], 80.0, 8)
    assert abs(seconds - 60.0) < 1e-9 and evals == 6
    assert region_budget(cold, [cold], -5.0, None) == (0.0, None)


@pytest.mark.slow
def test_a_region_without_an_applicable_strategy_gets_no_session(tmp_path, monkeypatch):
    """Without the general rules, the rules planner has nothing but the reference for mixtral's router
    matmul on tpu-v6e: it gets no session, and its share of the budget goes to the region that has one
    (routing and experts, tpu_moe). (With them, the router gets a session: the next test.)"""
    import asyncio

    import maxkernel.rules as rules
    from orchestrators.auto import AutoBudget, AutoResult
    from orchestrators.model_opt import run_model

    proposing = rules.propose_strategies
    monkeypatch.setattr(rules, "propose_strategies", lambda *a, **k: [
        s for s in proposing(*a, **k) if s.name != "template:fused_grid"])

    given: dict[str, float] = {}

    async def no_winner(info, budget: AutoBudget) -> AutoResult:
        given[info.task_id] = budget.time_s
        return AutoResult(session_id=info.task_id, task_id=info.task_id, target="tpu-v6e", brain="rules",
                          status="scored", stop_reason="nothing beat the reference")

    result = asyncio.run(run_model("mixtral_8x7b_moe", out=tmp_path, budget=AutoBudget(time_s=600.0),
                                   target="tpu-v6e", run_region=no_winner))
    refused = [r for r in result.regions if r.note == "no strategy applies on tpu-v6e"]
    assert refused and {r.kind for r in refused} == {"matmul"}
    assert all(r.status == "skipped" and r.task_id not in given and r.budget_s == 0.0 for r in refused)
    ran = [r for r in result.regions if r.task_id in given]
    assert len(ran) == len(result.regions) - len(refused) >= 1
    # The whole budget is shared by the regions that ran (less what extraction and the sessions took, and the
    # time kept for judging the re-joined layer).
    assert sum(given.values()) + result.judgement_reserve_s > 0.8 * 600.0
    assert all(r.status == "no faster kernel" for r in ran)
    assert result.correct and result.returned_reference


@pytest.mark.slow
def test_the_general_rules_give_the_router_matmul_a_session(tmp_path):
    """The general rules apply to mixtral's router matmul on tpu-v6e, so no region is refused."""
    from jaxbench.task import load_task
    from maxkernel.analysis import analyze_task
    from maxkernel.extract import extract_task
    from maxkernel.rules import propose_strategies

    extraction = extract_task(load_task("mixtral_8x7b_moe"), tmp_path / "regions", target="tpu-v6e", timing=False)
    kinds = {}
    for info in extraction.regions:
        region = load_task(info.path)
        kinds[info.kind] = [s.name for s in propose_strategies(region, analyze_task(region, "tpu-v6e"), "tpu-v6e")]
    assert "template:fused_grid" in kinds["matmul"]
