"""``tune``: search one strategy's parameter space with the evaluator as the judge.

The engine (``orchestrators.auto``) decides how long and how many trials a strategy gets; this only runs
the search inside those limits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from jaxbench.report import EvalReport
from maxkernel.rules.strategy import Strategy, render
from maxkernel.tuning import SearchSpace, Trial, TuneResult, tune_space

if TYPE_CHECKING:
    from jaxbench.task import Task


def tune(task: "Task", strategy: Strategy, target: str, evaluate: Callable[[str], EvalReport], budget_s: float,
         seed: int = 0, max_trials: int | None = None, on_trial: Callable[[Trial], None] | None = None,
         order: Callable[[list[dict[str, Any]]], list[dict[str, Any]]] | None = None) -> TuneResult:
    """Search ``strategy``'s parameter space within ``budget_s`` seconds and ``max_trials`` trials (in
    ``order`` if given: the learned cost model's)."""
    space = SearchSpace(params={k: v for k, v in strategy.space.items()}, defaults=strategy.params)
    return tune_space(strategy.name, space, lambda p: render(task, strategy, p), evaluate, task.id, target,
                      budget_s, extents=strategy.extents, seed=seed, max_trials=max_trials, on_trial=on_trial,
                      order=order)
