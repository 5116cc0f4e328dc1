"""Prompt files (actors/prompts/*.md) filled in with the task, recalled knowledge and feedback.

``string.Template`` ($name) rather than ``str.format``, so that braces in code and math need no escaping.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from string import Template
from typing import Any

import jax

from jaxbench.task import Task
from maxkernel.messages import Recall

PROMPTS = Path(__file__).resolve().parent / "prompts"


@lru_cache(maxsize=None)
def _file(name: str) -> str:
    return (PROMPTS / f"{name}.md").read_text(encoding="utf-8")


def render(name: str, **values: Any) -> str:
    values.setdefault("guide", _file("pallas_guide"))
    return Template(_file(name)).safe_substitute({k: str(v) for k, v in values.items()})


def system_prompt(role: str, **values: Any) -> str:
    return render(role, **values)


@lru_cache(maxsize=64)
def _shapes(task: Task, size: str) -> str:
    args = jax.eval_shape(lambda key: task.get_inputs(key, size)[0], jax.random.key(0))
    return ", ".join(f"{tuple(a.shape)} {a.dtype}" for a in args)


def task_block(task: Task, target: str, size: str) -> str:
    tol = task.spec.tolerance
    return render("task", task_id=task.id, category=task.spec.category, target=target,
                  description=task.spec.description.strip(), atol=tol.atol, rtol=tol.rtol, dtype=task.spec.dtype,
                  shapes=_shapes(task, size), reference=task.reference_path.read_text(encoding="utf-8").strip())


def recall_block(recall: Recall | None, limit_chars: int = 6000) -> str:
    if recall is None or not (recall.kernels or recall.notes):
        return "## Memory\nNothing recalled."
    out = ["## Memory"]
    used = 0
    for k in recall.kernels:
        if used + len(k.code) > limit_chars:
            break
        used += len(k.code)
        out.append(f"Verified kernel for {k.task_id} (similarity {k.score:.2f}, {k.speedup}x, {k.strategy}):\n"
                   f"```python\n{k.code.strip()}\n```")
    out += [f"Note ({n.outcome}): {n.text}" for n in recall.notes]
    return "\n\n".join(out)
