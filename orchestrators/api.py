"""The Python API: one call runs one optimization session (an Auto run on the actors) with any brain.

    import maxkernel
    result = maxkernel.optimize("12p_RMSNorm", target="cpu", budget_s=120, brain="rules")
    result.best_source, result.confirmed_speedup, result.session_id

The result is the same ``AutoResult`` for every brain, and what ``maxkernel optimize --json`` writes.
"""

from __future__ import annotations

from pathlib import Path

from actors.session import prepare_brain
from orchestrators.auto import AutoBudget, AutoResult, OnEvent, run_auto
from orchestrators.interrupt import run_interruptible


def optimize(task: str | Path, *, target: str = "cpu", budget_s: float | None = 300.0, evals: int | None = None,
             brain: str = "rules", seed: int = 0, model: str | None = None, base_url: str | None = None,
             transcript: Path | None = None, record_to: Path | None = None, max_tokens: int | None = None,
             max_cost_usd: float | None = None, data_dir: str | None = None, size: str = "cpu",
             on_event: OnEvent | None = None) -> AutoResult:
    """Optimize ``task`` (a suite id or a task folder) within ``budget_s`` seconds and ``evals`` evaluations.

    Raises before anything starts when a limit is not positive or the brain cannot run (ValueError,
    MissingApiKeyError, TranscriptError), the task does not load (TaskError) or the target is unknown (TargetError).
    """
    for name, value in (("budget_s", budget_s), ("max_cost_usd", max_cost_usd)):
        if value is not None and value <= 0:
            raise ValueError(f"{name}={value:g}: must be a positive number")
    for name, count in (("evals", evals), ("max_tokens", max_tokens)):
        if count is not None and count < 1:
            raise ValueError(f"{name}={count}: must be at least 1")
    config = prepare_brain(brain, model=model, base_url=base_url, transcript=transcript, record_to=record_to,
                           data_dir=data_dir)
    budget = AutoBudget(time_s=budget_s, max_evaluations=evals, max_tokens=max_tokens, max_cost_usd=max_cost_usd,
                        seed=seed)
    # Ctrl-C or SIGTERM: the session is stored as interrupted and Interrupted (a KeyboardInterrupt) is raised
    return run_interruptible(run_auto(str(task), config, target=target, size=size, budget=budget, mode="optimize",
                                      on_event=on_event))
