"""Shared fixtures: one real evaluator (with its real worker processes) per test session."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--sweep", action="store_true",
                     help="also run the tests marked `sweep` (every suite task a template matches; minutes)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Sweeps over every matching suite task run in CI's second step (`--sweep`); the README's test command
    checks one task per template, which keeps it under 30 minutes on 2 cores."""
    if config.getoption("--sweep"):
        return
    skip = pytest.mark.skip(reason="a sweep over every matching task: run with --sweep (CI does)")
    for item in items:
        if "sweep" in item.keywords:
            item.add_marker(skip)

@pytest.fixture(scope="session")
def evaluator() -> Iterator["object"]:
    from jaxbench.evaluate import EvalConfig, Evaluator

    ev = Evaluator(config=EvalConfig(timing_rounds=3, warmup_rounds=1, timeout_s=120))
    yield ev
    ev.close()


@pytest.fixture(scope="session")
def quick_evaluator() -> Iterator["object"]:
    """Correctness and integrity only (no timing rounds), the unseen size included: for sweeping many candidates."""
    from jaxbench.evaluate import EvalConfig, Evaluator

    ev = Evaluator(config=EvalConfig(timing=False, timeout_s=120, unseen_size=True))
    yield ev
    ev.close()


@pytest.fixture(scope="session")
def declared_size_evaluator() -> Iterator["object"]:
    """Correctness at the declared size only, for renderers that serve the sizes they were rendered for
    and refuse other shapes (the unseen-size check would fail them by design)."""
    from jaxbench.evaluate import EvalConfig, Evaluator

    ev = Evaluator(config=EvalConfig(timing=False, timeout_s=120, unseen_size=False))
    yield ev
    ev.close()


@pytest.fixture(autouse=True)
def _isolated_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Never touch the user's real data dir from a test."""
    monkeypatch.setenv("MAXKERNEL_DATA_DIR", str(tmp_path / "maxkernel-data"))
