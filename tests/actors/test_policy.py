"""The engine's rules (``actors.policy``): the bar, confirmation, shares, and the TPU rule that a strategy
slow to judge never starves the others; the last through the rules brain's tuner with a fake judge."""

from __future__ import annotations

import asyncio
import time

from actors import policy
from actors.brains.base import Tools
from actors.brains.rules import RulesBrain
from actors.config import ActorConfig
from actors.services import Services
from jaxbench.report import EvalReport as JudgeReport
from maxkernel.messages import Budget, KernelDraft, Plan, ProfileReport, Recall, StrategyRef


def _report(speedup: float | None, basis: str = "measured", status: str = "ok", seconds: float = 0.0) -> JudgeReport:
    return JudgeReport(task="t", status=status, correct=status == "ok", speedup=speedup, basis=basis,  # type: ignore[arg-type]
                       duration_s=seconds)


def test_a_suspect_baseline_is_measured_three_times_and_the_median_is_the_bar() -> None:
    assert policy.baseline_needs_more(_report(1.6)) and not policy.baseline_needs_more(_report(1.02))
    assert not policy.baseline_needs_more(_report(1.6, basis="modelled"))
    assert policy.baseline_bar([_report(1.6), _report(0.97), _report(1.02)]) == (1.02, 2)
    assert policy.baseline_bar([_report(0.8)]) == (1.0, 0)  # the bar is never below the reference itself
    assert policy.baseline_bar([_report(3.0, basis="modelled")]) == (1.0, 0)
    assert policy.baseline_bar([_report(None, status="runtime_error")]) == (1.0, 0)


def test_confirmation_is_the_lower_of_two_runs_or_the_median_of_three() -> None:
    bar = 1.1
    assert policy.confirm_more([2.0], bar)
    assert not policy.confirm_more([2.0, 1.5], bar)  # both clear the bar: the lower one counts
    assert policy.confirmed([2.0, 1.5]) == 1.5
    assert policy.confirm_more([2.0, 1.0], bar)  # they disagree: a third run decides
    assert policy.confirmed([2.0, 1.0, 1.3]) == 1.3 and policy.confirmed([2.0, 1.0, 0.9]) == 1.0
    assert not policy.confirm_more([2.0, 0.0], bar)  # a failed re-run ends it
    assert policy.confirmed([2.0, 0.0]) == 0.0
    assert not policy.confirm_more([2.0, 1.0, 1.3], bar)
    # A first reading too noisy to clear (its centre did): two fresh runs decide, the lower of them counts.
    assert policy.confirm_more([1.05], bar) and policy.confirm_more([1.05, 1.2], bar)
    assert not policy.confirm_more([1.05, 1.2, 1.15], bar) and policy.confirmed([1.05, 1.2, 1.15], bar) == 1.15
    assert policy.confirmation_label([1.05, 1.2, 1.15], bar) == "lower of two re-runs"
    assert not policy.confirm_more([1.05, 1.08], bar) and policy.confirmed([1.05, 1.08], bar) == 1.05
    assert policy.confirmed([1.05, 1.2, 1.0], bar) == 1.0  # the second fresh run did not clear
    assert not policy.needs_confirmation(_report(4.0, basis="modelled"))


def test_only_the_top_candidates_above_the_bar_are_confirmed() -> None:
    readings = [0.9, 3.0, 1.2, 2.0, 1.5, 1.05]
    assert policy.to_confirm(readings, float, 1.1) == [3.0, 2.0, 1.5]
    assert policy.to_confirm([0.9, 1.0], float, 1.1) == []


def test_shares_split_what_is_left_among_the_strategies_still_to_come() -> None:
    assert policy.share(120.0, 4) == 30.0 and policy.share(None, 4) is None and policy.share(-5.0, 2) == 0.0
    assert policy.trial_cap(20, 4) == 4  # five evaluations each, one of them the draft
    assert policy.trial_cap(2, 4) == 1 and policy.trial_cap(None, 4) is None


def test_on_tpu_pallas_strategies_are_worked_first_elsewhere_the_planner_order_stands() -> None:
    kinds = ["rewrite", "template", "rewrite", "recalled", "template", "reference"]
    order = policy.work_order(list(range(len(kinds))), lambda i: kinds[i], "tpu-v5e")
    # A kernel recalled for this very task first (it is verified already), then the Pallas strategies.
    assert [kinds[i] for i in order] == ["recalled", "template", "template", "rewrite", "rewrite", "reference"]
    assert order[:3] == [3, 1, 4] and order[3:] == [0, 2, 5]  # stable within each group
    assert policy.work_order(list(range(len(kinds))), lambda i: kinds[i], "cpu") == list(range(len(kinds)))


def test_on_tpu_a_clear_prior_outranks_the_pallas_first_rule() -> None:
    # (kind, prior): a rewrite that clearly won on similar tasks, one that won within noise, a Pallas
    # template memory knows nothing of, one that failed on similar tasks, a same-task recall, the reference.
    plan = [("template", -0.7), ("rewrite", 1.2), ("rewrite", 0.05), ("template", None), ("reference", None),
            ("recalled", None), ("rewrite", -0.5), ("template", 0.4)]
    order = policy.work_order(list(range(len(plan))), lambda i: plan[i][0], "tpu-v6e", lambda i: plan[i][1])
    # The recall first, the clear winners in the planner's order whatever their kind, then Pallas before
    # plain JAX among the unknown, the clear losers after them (Pallas first again), the reference last.
    assert order == [5, 1, 7, 3, 2, 0, 6, 4]
    # Without priors the Pallas-first rule alone decides, as before.
    assert policy.work_order(list(range(len(plan))), lambda i: plan[i][0], "tpu-v6e") == [5, 0, 3, 7, 1, 2, 6, 4]
    assert policy.work_order(list(range(len(plan))), lambda i: plan[i][0], "cpu", lambda i: plan[i][1]) == list(range(8))


def test_on_tpu_the_general_rules_come_after_the_rewrites_unless_memory_says_they_won() -> None:
    names = [("template", "template:fused_grid"), ("rewrite", "rewrite:sum_after_matmul"),
             ("template", "template:tpu_gemm"), ("reference", "reference")]
    kinds = [policy.order_kind(kind, name) for kind, name in names]
    assert kinds == ["general", "rewrite", "template", "reference"]
    assert policy.work_order(list(range(4)), lambda i: kinds[i], "tpu-v6e") == [2, 1, 0, 3]
    won = {0: 1.0}  # the general rules clearly won on similar tasks: that moves them no earlier
    assert policy.work_order(list(range(4)), lambda i: kinds[i], "tpu-v6e", won.get) == [2, 1, 0, 3]
    three = ["general", "restated", "reference"]
    assert policy.work_order([0, 1, 2], lambda i: three[i], "tpu-v6e") == [0, 1, 2]
    lost = {0: -1.0}  # ... but a loss there moves them back, behind a rewrite that restates the work
    assert policy.work_order([0, 1, 2], lambda i: three[i], "tpu-v6e", lost.get) == [1, 0, 2]


def test_a_rewrite_that_removes_no_work_comes_after_the_general_rules() -> None:
    plan = [("rewrite", "rewrite:idle_subgraphs", 1.0), ("template", "template:fused_grid", None),
            ("rewrite", "rewrite:sum_after_matmul", 0.001), ("reference", "reference", None)]
    kinds = [policy.order_kind(kind, name, ratio) for kind, name, ratio in plan]
    assert kinds == ["restated", "general", "rewrite", "reference"]
    assert policy.work_order(list(range(4)), lambda i: kinds[i], "tpu-v6e") == [2, 1, 0, 3]


def test_prior_bands_need_a_clear_win_or_loss() -> None:
    assert policy.prior_band(None) == 1 and policy.prior_band(0.05) == 1 and policy.prior_band(-0.05) == 1
    assert policy.prior_band(policy.MOVE * 1.01) == 0 and policy.prior_band(-policy.MOVE * 1.01) == 2


def test_a_trial_is_started_only_when_it_can_end_inside_the_share() -> None:
    assert policy.tune_window(30.0, 5.0) == 25.0
    assert policy.tune_window(30.0, 70.0) == 0.0  # a 70 s trial never starts in a 30 s share


def _profile(task, ref: StrategyRef, budget: Budget, draft_seconds: float) -> ProfileReport:  # type: ignore[no-untyped-def]
    from actors.brains.rules import _strategy
    from maxkernel.rules import render

    plan = Plan(session_id="s", task_id=task.id, strategies=[ref], budget=budget)
    draft = KernelDraft(session_id="s", task_id=task.id, candidate_id="c", plan=plan,
                        source=render(task, _strategy(ref), dict(ref.params)))
    return ProfileReport(session_id="s", task_id=task.id, draft=draft, diagnosis="",
                         report=_report(1.0, seconds=draft_seconds))


def test_the_tuner_gives_a_strategy_slow_to_judge_no_trials_and_a_fast_one_its_share() -> None:
    from jaxbench.task import load_task
    from maxkernel.analysis import analyze_task
    from maxkernel.rules import propose_strategies

    task = load_task("12p_RMSNorm")
    tunable = next(s for s in propose_strategies(task, analyze_task(task, "cpu"), "cpu") if s.space)
    ref = StrategyRef(name=tunable.name, kind=tunable.kind, params=dict(tunable.params), space=dict(tunable.space),
                      target="cpu", extents=dict(tunable.extents))
    judged: list[str] = []

    async def evaluate(source: str, _timing: bool) -> JudgeReport:
        judged.append(source)
        return _report(1.5, seconds=0.01)

    async def recall() -> Recall:
        return Recall(session_id="s", task_id=task.id)

    services = Services(ActorConfig(remember=False))  # an empty memory: no priors move the order
    brain = RulesBrain("tuner", services, Tools(task=task, target="cpu", size="cpu", evaluate=evaluate, recall=recall))
    share = Budget(tune_budget_s=30.0, tune_max_trials=None, share_ends_at=time.time() + 30.0)
    try:
        # Its draft took 70 s to judge (a plain-JAX trial on a TPU target): no trial fits its 30 s share.
        slow = asyncio.run(brain.tune(_profile(task, ref, share, draft_seconds=70.0)))
        assert judged == [] and slow.trials == [] and slow.best_report.speedup == 1.0

        # A fast one is tuned, and its own draft is not judged a second time.
        fast = asyncio.run(brain.tune(_profile(task, ref, share.model_copy(update={"tune_max_trials": 3}), 0.01)))
    finally:
        asyncio.run(services.aclose())
    drafted = _profile(task, ref, share, 0.01).draft.source.strip()
    assert 1 <= len(judged) <= 3 and all(s.strip() != drafted for s in judged)
    assert fast.best_report.speedup == 1.5 and fast.trials
