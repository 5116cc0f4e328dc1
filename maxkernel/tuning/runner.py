"""Runner: turns one configuration into a measured Trial (render, then evaluate)."""

from __future__ import annotations

import time
from typing import Any, Callable

from jaxbench.report import EvalReport
from maxkernel.tuning.database import Trial


def run_config(strategy: str, params: dict[str, Any], render: Callable[[dict[str, Any]], str],
               evaluate: Callable[[str], EvalReport], task_id: str) -> tuple[Trial, str]:
    """Render and evaluate one configuration; a template that cannot render becomes a failed Trial."""
    started = time.monotonic()
    try:
        source = render(params)
    except Exception as exc:  # a template refusing a configuration is a result, not a crash
        report = EvalReport(task=task_id, status="compile_error", reason=f"render failed: {type(exc).__name__}: {exc}")
        return Trial(strategy=strategy, params=params, report=report, seconds=time.monotonic() - started), ""
    report = evaluate(source)
    return Trial(strategy=strategy, params=params, report=report, seconds=time.monotonic() - started), source
