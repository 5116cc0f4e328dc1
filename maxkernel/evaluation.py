"""Evaluating a candidate for a target: the one entry point every part of MaxKernel uses.

CPU and GPU targets go straight to the JaxBench evaluator; TPU targets add Mosaic lowering validation
and the roofline cost model (``maxkernel.targets``) around it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from jaxbench.evaluate import Evaluator
    from jaxbench.report import EvalReport
    from jaxbench.task import Task

KNOWN_TARGETS = ("cpu", "gpu", "tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e", "tpu-v7")


class TargetError(ValueError):
    """An unknown or unusable target name."""


def evaluate_candidate(
    task: "Task",
    source: str,
    target: str = "cpu",
    size: str = "cpu",
    filename: str = "candidate.py",
    evaluator: "Evaluator | None" = None,
    progress: Callable[[str], None] | None = None,
) -> "EvalReport":
    if target not in KNOWN_TARGETS:
        raise TargetError(f"unknown target {target!r} (known: {', '.join(KNOWN_TARGETS)})")
    from jaxbench.evaluate import default_evaluator

    ev = evaluator or default_evaluator()
    return ev.evaluate(task, source, target=target, size=size, filename=filename, progress=progress)
