"""Pricing configurations with the TPU cost model before any is checked for correctness.

On a ``tpu-*`` target without a TPU, a configuration's figure is the model's, and pricing one needs only
lowering and modelling (a sandboxed process, seconds), while checking it needs a TPU-interpret run (often
much longer). So the tuner prices the legal space first, sorts it by modelled time, and checks the
cheapest first: the first correct configuration in that order is the modelled best that is also proven.
Pricing spends at most a share of the tuning budget; what is left unpriced keeps the estimate's order.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import structlog

from maxkernel.tuning.space import Config

log = structlog.get_logger("maxkernel.tuning")

Price = Callable[[str], float | None]  # modelled ms of a candidate source; None when it does not lower


def model_pricer(task_id: str, target: str) -> Price | None:
    """Modelled time through the sandboxed lowering and model stage; None off TPU targets or for a task
    that cannot be loaded here."""
    if not target.startswith("tpu-"):
        return None
    from jaxbench.task import load_task
    from maxkernel.targets.sandboxed import run_tpu_stage

    try:
        task = load_task(task_id)
    except Exception:  # a task id the suite does not know: tune without pricing
        return None
    generation = target.removeprefix("tpu-")

    def price(source: str) -> float | None:
        result = run_tpu_stage(task.path, source, generation)
        if result.model is None:
            return None
        return float(result.model["time_ms"])

    return price


def rank_by_price(configs: list[Config], render: Callable[[dict[str, Any]], str], price: Price,
                  budget_s: float) -> tuple[list[Config], dict[int, float]]:
    """``configs`` cheapest-modelled first, then those that did not lower, then the unpriced (budget out).

    Returns the new order and each priced configuration's modelled ms (by its index in the new order).
    """
    deadline = time.monotonic() + budget_s
    priced: list[tuple[float, int]] = []
    failed: list[int] = []
    unpriced: list[int] = []
    for index, config in enumerate(configs):
        if time.monotonic() >= deadline:
            unpriced.append(index)
            continue
        try:
            ms = price(render(config))
        except Exception as exc:  # a configuration the template refuses is a result, not a crash
            log.info("unpriced", params=config, reason=f"{type(exc).__name__}: {exc}")
            ms = None
        if ms is None:
            failed.append(index)
        else:
            priced.append((ms, index))
    priced.sort()
    order = [i for _, i in priced] + failed + unpriced
    modelled = {position: ms for position, (ms, _) in enumerate(priced)}
    return [configs[i] for i in order], modelled
