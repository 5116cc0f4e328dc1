"""The rules brain's knowledge behind one plain API (no model, no network).

    propose_strategies(task, analysis, target) -> list[Strategy]      ordered, best first
    render(task, strategy, params=None) -> str                          candidate source
    fix_known_error(source, report) -> str | None                       the rules debugger
    tune(task, strategy, target, evaluate, budget_s, seed, max_trials) -> TuneResult

An optimization is an Auto session on the actors (``maxkernel.optimize``), whose rules brain calls these.
"""

from __future__ import annotations

from maxkernel.rules.fixes import fix_known_error
from maxkernel.rules.strategy import Strategy, propose_strategies, reference_source, render
from maxkernel.rules.tuner import tune
from maxkernel.tuning import Trial, TuneResult

__all__ = ["Strategy", "Trial", "TuneResult", "fix_known_error", "propose_strategies", "reference_source", "render",
           "tune"]
