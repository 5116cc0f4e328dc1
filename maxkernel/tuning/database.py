"""Tuning database: every measured configuration and its report; answers "what is the best so far"."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from jaxbench.report import EvalReport


class Trial(BaseModel):
    strategy: str
    params: dict[str, Any] = Field(default_factory=dict)
    report: EvalReport
    seconds: float = 0.0

    @property
    def score(self) -> float:
        """The lower end of the speedup's interval when correct, else 0 (failed trials never win, and a noisy
        lucky reading does not beat a steady one)."""
        return self.report.low


class Database(BaseModel):
    trials: list[Trial] = Field(default_factory=list)

    def add(self, trial: Trial) -> None:
        self.trials.append(trial)

    def best(self, strategy: str | None = None) -> Trial | None:
        pool = [t for t in self.trials if (strategy is None or t.strategy == strategy) and t.score > 0]
        return max(pool, key=lambda t: t.score, default=None)

    def seen(self, strategy: str, params: dict[str, Any]) -> bool:
        return any(t.strategy == strategy and t.params == params for t in self.trials)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.model_dump(mode="json"), indent=2))
