"""Task folders for the target tests, written once per session into a temporary directory."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from target_kernels import GATHER_TASK, MATMUL_TASK, RMSNORM_TASK, write_task  # noqa: E402

from jaxbench.task import Task, load_task  # noqa: E402


@pytest.fixture(scope="session")
def matmul_task(tmp_path_factory: pytest.TempPathFactory) -> Task:
    return load_task(write_task(tmp_path_factory.mktemp("tasks") / "tgt_matmul", MATMUL_TASK))


@pytest.fixture(scope="session")
def rmsnorm_task(tmp_path_factory: pytest.TempPathFactory) -> Task:
    return load_task(write_task(tmp_path_factory.mktemp("tasks") / "tgt_rmsnorm", RMSNORM_TASK))


@pytest.fixture(scope="session")
def gather_task(tmp_path_factory: pytest.TempPathFactory) -> Task:
    return load_task(write_task(tmp_path_factory.mktemp("tasks") / "tgt_gather", GATHER_TASK))


@pytest.fixture
def xla_fallback(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """XLA code priced by the fallback roofline (XLA:CPU bytes) even where the TPU compiler is installed: for
    tests of that roofline's own arithmetic."""
    from maxkernel.targets import xla_tpu

    monkeypatch.setenv("MAXKERNEL_NO_TPU_COMPILER", "1")
    xla_tpu.tpu_compiler.cache_clear()
    yield
    xla_tpu.tpu_compiler.cache_clear()
