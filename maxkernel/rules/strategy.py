"""Strategies: the rules brain's menu for one task (rewrites, templates, the reference), best first."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import structlog
from pydantic import BaseModel, Field

from maxkernel.rewrites.structural import structural_rewrites
from maxkernel.rules.views import VIEWS, task_view, wrap_candidate
from maxkernel.sketches import SKETCHES
from maxkernel.templates import TEMPLATES
from maxkernel.templates.base import sizes_for, tpu_target
from maxkernel.templates.gpu import GPU_TEMPLATES
from maxkernel.templates.gpu_base import gpu_sizes, gpu_target
from maxkernel.templates.tpu import TPU_TEMPLATES

if TYPE_CHECKING:
    from jaxbench.task import Task
    from maxkernel.analysis import TaskAnalysis


class Strategy(BaseModel):
    name: str  # e.g. "rewrite:sum_after_matmul", "template:rowblock", "reference"
    kind: Literal["rewrite", "template", "reference"]
    params: dict[str, Any] = Field(default_factory=dict)  # default values of tunable params
    space: dict[str, list[Any]] = Field(default_factory=dict)  # legal values per tunable param
    rationale: str = ""
    target: str = "cpu"
    extents: dict[str, int] = Field(default_factory=dict, description="what each block parameter tiles")
    work_ratio: float | None = Field(None, description="a rewrite's arithmetic over the reference's (by shapes)")


REFERENCE = "reference"
log = structlog.get_logger("maxkernel.rules.strategy")


def propose_strategies(task: "Task", analysis: "TaskAnalysis", target: str = "cpu") -> list[Strategy]:
    """Rewrites that remove work first (they win on every target), then Pallas templates, then the reference."""
    from maxkernel.rewrites import BY_NAME, propose_rewrites

    found: list[Strategy] = []
    for rewritten in propose_rewrites(task, "cpu", target):
        label = "+".join(rewritten.names)
        why = "; ".join(f"{BY_NAME[n].description} ({rewritten.sites[n]} site{'s' if rewritten.sites[n] > 1 else ''})"
                        for n in rewritten.names)
        found.append(Strategy(name=f"rewrite:{label}", kind="rewrite", params={"rewrites": rewritten.names},
                              rationale=why, target=target, work_ratio=rewritten.work_ratio))
    for structural in structural_rewrites():
        if structural.applies(task, analysis) is not None:
            continue
        space = structural.space(task, analysis, target)
        found.append(Strategy(name=f"rewrite:{structural.name}", kind="rewrite", params=space.defaults,
                              space=space.space, rationale=structural.description, target=target))
    planned = _template_strategies(task, analysis, target)
    for kind in VIEWS:  # what does not apply to the task as it is may apply to it in another layout
        try:
            planned.extend(_view_strategies(task, analysis, target, kind, {s.name for s in found + planned}))
        except Exception as exc:  # a view is an extra; its defect costs only what it would add
            log.warning("view_failed", task=task.id, view=kind, error=f"{type(exc).__name__}: {exc}")
    order = [f"template:{t.name}" for t in templates_for(target)]
    found.extend(sorted(planned, key=lambda s: order.index(s.name)))
    found.append(Strategy(name=REFERENCE, kind="reference", rationale="the reference itself (the baseline)", target=target))
    return found


def _view_strategies(task: "Task", analysis: "TaskAnalysis", target: str, kind: str, planned: set[str]) -> list[Strategy]:
    """The templates not in ``planned`` that apply to the task's ``kind`` view, marked to render there."""
    view = task_view(task, kind)
    if view is None:
        return []
    from maxkernel.analysis import analyze_task

    found = _template_strategies(view, analyze_task(view, target, analysis.size), target, skip=planned)
    for strategy in found:
        strategy.params["view"] = kind
        strategy.rationale += f" (run in the task's {kind.replace('_', ' ')} view)"
    return found


def _template_strategies(task: "Task", analysis: "TaskAnalysis", target: str,
                         skip: set[str] = frozenset()) -> list[Strategy]:  # type: ignore[assignment]
    """A strategy for each template of ``target`` that applies to ``task`` (and is not named in ``skip``)."""
    found = []
    for template in templates_for(target):
        if f"template:{template.name}" in skip:
            continue
        try:
            reason = template.applies(task, analysis)
            space = template.space(task, analysis, target) if reason is None else None
        except Exception as exc:  # one template's defect costs its own strategy, never the others'
            log.warning("template_failed", template=template.name, task=task.id, error=f"{type(exc).__name__}: {exc}")
            continue
        if space is None:
            continue
        if not any(space.space.values()) and space.space:
            continue
        extents = {"block_rows": analysis.rows.rows} if analysis.rows is not None else {}
        found.append(Strategy(name=f"template:{template.name}", kind="template", params=space.defaults,
                              space=space.space, rationale=template.description, target=target, extents=extents))
    return found


def templates_for(target: str) -> tuple[Any, ...]:
    """GPU targets get the GPU Pallas templates (the TPU ones emit Mosaic TPU code); TPU targets the expert
    TPU sketches first, then the default ones, then the general rules (``maxkernel.sketches``), which apply
    to most computations and so come after every template that serves a structure; the rest the default
    ones."""
    if gpu_target(target):
        return GPU_TEMPLATES
    return TPU_TEMPLATES + TEMPLATES + SKETCHES if tpu_target(target) else TEMPLATES


def render(task: "Task", strategy: Strategy, params: dict[str, Any] | None = None) -> str:
    """Candidate source for ``strategy`` with ``params`` (its defaults where not given)."""
    from maxkernel.rewrites import render_rewrite

    chosen = {**strategy.params, **(params or {})}
    sizes = gpu_sizes(strategy.target) if gpu_target(strategy.target) else sizes_for(strategy.target)
    if strategy.kind == "rewrite":
        structural = next((r for r in structural_rewrites() if f"rewrite:{r.name}" == strategy.name), None)
        if structural is not None:
            return structural.render(task, chosen, sizes)
        return render_rewrite(task, list(chosen["rewrites"]), sizes)
    if strategy.kind == "template":
        template = next(t for t in templates_for(strategy.target) if f"template:{t.name}" == strategy.name)
        kind = chosen.pop("view", None)
        if kind is not None:
            view = task_view(task, kind)
            if view is None:
                raise ValueError(f"{task.id}: {strategy.name} was planned in the {kind} view, which the task is not in")
            return wrap_candidate(template.render(view, chosen, sizes), task, kind)
        return template.render(task, chosen, sizes)
    return reference_source(task)


def reference_source(task: "Task") -> str:
    """The reference itself as a candidate: its own file with ``kernel`` bound to ``reference``."""
    text = task.reference_path.read_text()
    return text.rstrip() + "\n\n\ndef kernel(*args, **static):\n    return reference(*args, **static)\n"
