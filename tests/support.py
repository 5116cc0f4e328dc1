"""Helpers shared by test modules (conftest.py holds only fixtures: its module name is not unique)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "jaxbench" / "examples"


def reference_candidate(task_id: str) -> str:
    """The task's own reference, as a candidate file (the honest baseline)."""
    from jaxbench.task import load_task

    return load_task(task_id).reference_path.read_text() + "\n\nkernel = reference\n"
