"""The rules brain: the model-free optimizer (jaxpr analysis, rewrites, templates, known fixes, tuning)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from actors.brains.base import Brain, Diagnosis, FixedDraft, PlanOutcome, TuneOutcome
from actors.policy import tune_window
from actors.priors import prioritize, tuning_priors
from actors.profile_facts import gather, rules_diagnosis
from jaxbench.report import EvalReport as JudgeReport, format_speedup
from maxkernel.messages import Budget, EvalReport, FixRequest, OptimizeRequest, Plan, ProfileReport, Recall, StrategyRef, TuneTrial

RECALLED = "recalled"


def _strategy(ref: StrategyRef) -> Any:
    from maxkernel.rules import Strategy

    return Strategy(name=ref.name, kind=ref.kind, params=dict(ref.params), space=dict(ref.space),
                    rationale=ref.rationale, target=ref.target, extents=dict(ref.extents))


class RulesBrain(Brain):
    async def plan(self, request: OptimizeRequest, recall: Recall) -> PlanOutcome:
        from maxkernel.analysis import analyze_task
        from maxkernel.rules import propose_strategies

        task = self.tools.task
        analysis = await asyncio.to_thread(analyze_task, task, request.target, request.size)
        proposed = await asyncio.to_thread(propose_strategies, task, analysis, request.target)
        tried = set(request.exclude)
        strategies = [StrategyRef(name=s.name, kind=s.kind, params=dict(s.params), space=dict(s.space),
                                  rationale=s.rationale, target=s.target, extents=dict(s.extents),
                                  work_ratio=s.work_ratio)
                      for s in proposed if s.name not in tried]
        # A kernel already verified for this very task (and target: recall filters by it) is tried first:
        # it costs one evaluation. Similarity scores mix in the code, so the task id decides, not the score.
        same = [k for k in recall.kernels if k.task_id == task.id]
        if same:
            best = max(same, key=lambda k: k.low)  # by the lower end: a lucky reading is not the one recalled
            strategies.insert(0, StrategyRef(name=recalled_name(best.strategy, best.id), kind=RECALLED,
                                             params={"source": best.code},
                                             rationale=f"verified before for this task as kernel {best.id[:12]} "
                                                       f"({format_speedup(best.speedup, best.speedup_ci)})"))
        # The one place memory orders the plan: strategies that won on the nearest measured tasks (same op
        # family first) go first, those that failed or lost there last, and each tunable one is drafted at
        # the parameters it reached there (or the learned cost model's pick).
        strategies, remembered = await asyncio.to_thread(prioritize, self.services.memory, task, request.target,
                                                         strategies, self.services.settings.cache_path)
        notes = "\n".join([n.text for n in recall.notes] + ([remembered] if remembered else [])
                          + ([request.feedback] if request.feedback else []))
        return PlanOutcome(analysis=analysis.summary(), strategies=strategies, notes=notes)

    async def draft(self, plan: Plan, feedback: str | None = None) -> str:
        from maxkernel.rules import render

        ref = plan.current
        if ref.kind == RECALLED:
            return str(ref.params["source"])
        return await asyncio.to_thread(render, self.tools.task, _strategy(ref), dict(ref.params))

    async def fix(self, request: FixRequest) -> str | FixedDraft | None:
        from maxkernel.rules import fix_known_error, render

        fixed = await asyncio.to_thread(fix_known_error, request.draft.source, request.report)
        if fixed is not None:
            return fixed
        # Memory drafted the strategy at another task's parameters and they failed here (a check over the
        # limits, a timeout, a wrong result at this shape): the strategy's own parameters are tried next.
        ref = request.draft.plan.current
        if ref.kind == RECALLED or not ref.defaults or ref.defaults == ref.params:
            return None
        source = await asyncio.to_thread(render, self.tools.task, _strategy(ref), dict(ref.defaults))
        return FixedDraft(source=source, params=dict(ref.defaults),
                          why=f"memory's parameters {ref.params} failed ({request.report.status}); "
                              f"drafted again at the strategy's own {ref.defaults}")

    async def profile(self, report: EvalReport) -> Diagnosis:
        facts = gather(report.report)
        diagnosis, tries = rules_diagnosis(facts, self.tools.target)
        return Diagnosis(bound=facts.bound, diagnosis=diagnosis, suggestions=tries)

    async def tune(self, profile: ProfileReport) -> TuneOutcome:
        from maxkernel.rules import tune

        ref = profile.draft.plan.current
        budget = profile.draft.plan.budget
        if ref.kind == RECALLED or not ref.space:
            return TuneOutcome(best_source=profile.draft.source, best_report=profile.report, best_params=dict(ref.params))
        window = tune_seconds(budget, profile.report.duration_s)
        if window <= 0:
            return TuneOutcome(best_source=profile.draft.source, best_report=profile.report, best_params=dict(ref.params))
        loop = asyncio.get_running_loop()
        drafted = profile.draft.source.strip()

        def evaluate(source: str) -> JudgeReport:
            # The draft at its own parameters was judged already: its report stands, no second evaluation.
            if source.strip() == drafted:
                return profile.report
            # rules.tune runs in a worker thread; each trial goes to the tester through the bus.
            return asyncio.run_coroutine_threadsafe(self.tools.evaluate(source, True), loop).result()

        # Recalled parameters (scaled to this task) are tried first, the learned cost model orders the rest.
        start, order = await asyncio.to_thread(tuning_priors, self.services.memory, self.services.settings.cache_path,
                                               self.tools.task, ref, self.tools.target)
        # When tuning starts where the draft was written, the first trial is the draft (both orders measure
        # the start first): judged already, it costs no evaluation and takes none of the strategy's trials.
        free = int(start.params == ref.params)
        trials = None if budget.tune_max_trials is None else budget.tune_max_trials + free
        result = await asyncio.to_thread(tune, self.tools.task, _strategy(start), self.tools.target, evaluate,
                                         window, budget.seed, trials, order=order)
        return _outcome(self.tools.task, ref, result, profile)


def recalled_name(strategy: str | None, kernel_id: str) -> str:
    """``recall:<the strategy that made it>``: what reports and exports show a person, where a kernel id
    says nothing (a kernel recalled again keeps its first strategy's name; the id is in the rationale)."""
    base = strategy or ""
    while base.startswith("recall:"):
        base = base[len("recall:"):]
    return f"recall:{base or kernel_id[:12]}"


def tune_seconds(budget: Budget, trial_s: float) -> float:
    """How long the tuner may start trials: ``tune_budget_s``, cut to the strategy's share when one is set."""
    left = budget.tune_budget_s
    if budget.share_ends_at is not None:
        left = min(left, budget.share_ends_at - time.time())
    return tune_window(left, trial_s)


def _outcome(task: Any, ref: StrategyRef, result: Any, profile: ProfileReport) -> TuneOutcome:
    """The tuned kernel if it beats the profiled one, else the profiled one; every trial kept."""
    trials = [TuneTrial(params=dict(t.params), status=t.report.status, speedup=t.report.speedup,
                        kernel_ms=t.report.kernel_ms) for t in result.trials]
    best_report = result.best_report
    base = profile.report
    if best_report is not None and best_report.passed and best_report.low > base.low:
        return TuneOutcome(best_source=result.best_source, best_report=best_report,
                           best_params=dict(result.best_params or {}), trials=trials)
    return TuneOutcome(best_source=profile.draft.source, best_report=base, best_params=dict(ref.params), trials=trials)
