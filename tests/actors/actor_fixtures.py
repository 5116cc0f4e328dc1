"""Fixtures of the actor tests, imported by each test module (this folder has no conftest.py: other test
modules import ``conftest`` by name, and a second one here would shadow theirs)."""

from __future__ import annotations

import atexit
from functools import lru_cache
from pathlib import Path

import pytest


@lru_cache(maxsize=1)
def shared_evaluator() -> object:
    """One real evaluator (a sandboxed worker process) for every in-process session of the run."""
    from jaxbench.evaluate import EvalConfig, Evaluator

    ev = Evaluator(config=EvalConfig(correctness_seeds=1, timing_rounds=2, warmup_rounds=1, timeout_s=120))
    atexit.register(ev.close)
    return ev


@pytest.fixture
def actor_evaluator() -> object:
    return shared_evaluator()


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    path = tmp_path / "data"
    path.mkdir()
    return path
