"""Writing a draft as a task folder, its tolerance set from the reference's own error."""

from __future__ import annotations

from pathlib import Path

import yaml

from jaxbench.generate.draft import Draft
from jaxbench.generate.tolerance import MARGIN, tolerance_for


def write_task(draft: Draft, folder: Path, task_id: str, margin: float = MARGIN) -> float:
    """Write ``task.yaml`` and ``reference.py`` under ``folder``; returns the reference's own error.

    The tolerance is ``margin`` times that error (see :mod:`jaxbench.generate.tolerance`), so the spec is
    written twice: once to load the task, once with the tolerance measured on it.
    """
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "reference.py").write_text(draft.source)
    _write_spec(folder, draft, task_id, 1.0, 1.0)
    atol, rtol, error = tolerance_for(folder, draft.dtype, margin)
    _write_spec(folder, draft, task_id, atol, rtol)
    return error


def _write_spec(folder: Path, draft: Draft, task_id: str, atol: float, rtol: float) -> dict:
    spec = draft.spec(task_id, atol, rtol)
    (folder / "task.yaml").write_text(yaml.safe_dump(spec, sort_keys=False, width=110))
    return spec
