"""Autotuning in TVM MetaSchedule's split: search space, search strategy, cost model, database, runner.

``tune_space`` measures configurations in the strategy's order until the budget ends, the trial limit is
reached, or ``patience`` trials in a row bring no improvement. Ranking uses the evaluator's speedup, which
is measured on CPU/GPU and modelled (``maxkernel.targets`` roofline) on TPU targets. On TPU targets the
whole legal space is first priced by the model (``pricing``: lowering and modelling, no correctness run)
and checked cheapest first, so the evaluator's slow correctness runs go to the configurations that would
win.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import structlog
from pydantic import BaseModel, Field

from jaxbench.report import EvalReport
from maxkernel.tuning.database import Database, Trial
from maxkernel.tuning.pricing import Price, model_pricer, rank_by_price
from maxkernel.tuning.runner import run_config
from maxkernel.tuning.space import Config, SearchSpace
from maxkernel.tuning.strategy import order as hand_order

log = structlog.get_logger("maxkernel.tuning")

PRICING_SHARE = 0.5  # of the tuning budget, at most, spent pricing before checking starts

__all__ = ["Database", "SearchSpace", "Trial", "TuneResult", "tune_space"]


class TuneResult(BaseModel):
    strategy: str
    best_params: dict[str, Any] | None = None
    best_report: EvalReport | None = None
    best_source: str = ""
    trials: list[Trial] = Field(default_factory=list)
    stopped: str = ""  # why the search ended: exhausted | budget | max_trials | no_improvement
    order: list[dict[str, Any]] = Field(default_factory=list, description="configurations in the order tried")
    modelled_ms: list[float | None] = Field(default_factory=list, description="modelled ms of each, when priced")


def tune_space(strategy: str, space: SearchSpace, render: Callable[[dict[str, Any]], str],
               evaluate: Callable[[str], EvalReport], task_id: str, target: str, budget_s: float,
               extents: dict[str, int] | None = None, seed: int = 0, max_trials: int | None = None,
               patience: int = 3, on_trial: Callable[[Trial], None] | None = None,
               order: Callable[[list[Config]], list[Config]] | None = None,
               price: Price | None = None) -> TuneResult:
    """Measure configurations until a stopping rule holds.

    ``order``, when given (memory's priors and the learned cost model), replaces the hand-written order.
    ``price`` (default: the TPU model on ``tpu-*`` targets) then re-ranks the whole space by modelled time,
    spending at most PRICING_SHARE of the budget; what it cannot price keeps the order it had.
    """
    deadline = time.monotonic() + budget_s
    db = Database()
    result = TuneResult(strategy=strategy, stopped="exhausted")
    best_score, since_best = 0.0, 0
    configs = space.configs()
    configs = order(configs) if order is not None else hand_order(configs, extents or {}, target, seed)
    price = price if price is not None else model_pricer(task_id, target)
    if price is not None and len(configs) > 1:
        configs, modelled = rank_by_price(configs, render, price, budget_s * PRICING_SHARE)
        result.modelled_ms = [modelled.get(i) for i in range(len(configs))]
        log.info("priced", strategy=strategy, configs=len(configs), priced=len(modelled))
    result.order = configs
    for config in configs:
        if max_trials is not None and len(db.trials) >= max_trials:
            result.stopped = "max_trials"
            break
        if time.monotonic() >= deadline:
            result.stopped = "budget"
            break
        trial, source = run_config(strategy, config, render, evaluate, task_id)
        db.add(trial)
        log.info("trial", strategy=strategy, params=config, status=trial.report.status, speedup=trial.report.speedup)
        if on_trial is not None:
            on_trial(trial)
        if trial.score > best_score:
            best_score, since_best = trial.score, 0
            result.best_params, result.best_report, result.best_source = config, trial.report, source
        else:
            since_best += 1
            if since_best >= patience:
                result.stopped = "no_improvement"
                break
    result.trials = db.trials
    return result
