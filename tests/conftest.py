"""Shared fixtures: one real evaluator (with its real worker processes) per test session."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "jaxbench" / "examples"


@pytest.fixture(scope="session")
def evaluator() -> Iterator["object"]:
    from jaxbench.evaluate import EvalConfig, Evaluator

    ev = Evaluator(config=EvalConfig(timing_rounds=3, warmup_rounds=1, timeout_s=120))
    yield ev
    ev.close()


@pytest.fixture(scope="session")
def quick_evaluator() -> Iterator["object"]:
    """Correctness and integrity only (no timing rounds): for sweeping many candidates."""
    from jaxbench.evaluate import EvalConfig, Evaluator

    ev = Evaluator(config=EvalConfig(timing=False, timeout_s=120))
    yield ev
    ev.close()


@pytest.fixture(autouse=True)
def _isolated_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Never touch the user's real data dir from a test."""
    monkeypatch.setenv("MAXKERNEL_DATA_DIR", str(tmp_path / "maxkernel-data"))


def reference_candidate(task_id: str) -> str:
    """The task's own reference, as a candidate file (the honest baseline)."""
    from jaxbench.task import load_task

    return load_task(task_id).reference_path.read_text() + "\n\nkernel = reference\n"
