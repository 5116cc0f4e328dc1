"""The rules brain's knowledge behind one plain API (no model, no network).

    propose_strategies(task, analysis, target) -> list[Strategy]      ordered, best first
    render(task, strategy, params=None) -> str                          candidate source
    fix_known_error(source, report) -> str | None                       the rules debugger
    tune(task, strategy, target, evaluate, budget_s, seed, max_trials) -> TuneResult
    optimize_rules(task, target, budget_s, evaluator, on_event, seed) -> OptimizeResult
"""

from __future__ import annotations

from maxkernel.rules.fixes import fix_known_error
from maxkernel.rules.optimize import OptimizeResult, optimize_rules, tune
from maxkernel.rules.strategy import Strategy, propose_strategies, reference_source, render
from maxkernel.tuning import Trial, TuneResult

__all__ = ["OptimizeResult", "Strategy", "Trial", "TuneResult", "fix_known_error", "optimize_rules",
           "propose_strategies", "reference_source", "render", "tune"]
