"""Fixtures of the orchestrator tests: a fast real evaluator, and settings that keep sessions short."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "actors"))  # the replay transcripts of the actor tests

FAST_ENV = {"MAXKERNEL_EVAL_TIMING_ROUNDS": "2", "MAXKERNEL_EVAL_CORRECTNESS_SEEDS": "1", "JAX_PLATFORMS": "cpu"}


@pytest.fixture(scope="session")
def orch_evaluator() -> Iterator[object]:
    """One real evaluator (sandboxed worker process) shared by the in-process runs."""
    from jaxbench.evaluate import EvalConfig, Evaluator

    ev = Evaluator(config=EvalConfig(correctness_seeds=1, timing_rounds=2, warmup_rounds=1, timeout_s=120))
    yield ev
    ev.close()


@pytest.fixture
def fast_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Settings for processes the test starts: few timing rounds, one correctness seed."""
    for key, value in FAST_ENV.items():
        monkeypatch.setenv(key, value)
    return FAST_ENV

