"""Fixtures of the fleet tests: the throwaway PostgreSQL server of the memory tests, reused."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

_spec = importlib.util.spec_from_file_location("memory_test_fixtures", Path(__file__).parent.parent / "memory" / "conftest.py")
assert _spec is not None and _spec.loader is not None
_memory = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_memory)

pg_admin_url = _memory.pg_admin_url
pg_url = _memory.pg_url
store_url = _memory.store_url
_isolated_env = _memory._isolated_env
free_port = _memory.free_port


def stop_all(procs: list[Any]) -> None:
    """SIGTERM the processes a test started, newest first; SIGKILL the group of any that lingers."""
    import os
    import signal
    import subprocess

    for proc in reversed(procs):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
