"""Whole-layer optimization: extract the regions, optimize the hottest first with the budget shared by their
share of the layer's time, splice every verified region kernel back into one layer candidate, and judge
that candidate with the evaluator like any other. Each region is one ordinary optimization session on the
actors, so memory carries over from one region to the next.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

import structlog
from pydantic import BaseModel, Field

from actors import policy
from jaxbench.report import format_speedup
from jaxbench.task import Task, load_task
from maxkernel.evaluation import evaluate_candidate
from maxkernel.extract import Extraction, extract_task
from maxkernel.extract.layer import RegionInfo
from maxkernel.extract.splice import splice
from orchestrators.auto import AutoBudget, AutoResult, run_auto

log = structlog.get_logger(__name__)

MIN_REGION_BUDGET_S = 8.0  # below this a session cannot even judge the reference and one candidate


class RegionRow(BaseModel):
    index: int
    task_id: str
    kind: str
    share: float
    budget_s: float
    evals: int | None = Field(None, description="the region's share of the evaluations (None: no limit)")
    before_ms: float | None = None
    after_ms: float | None = None
    speedup: float | None = None
    speedup_ci: tuple[float, float] | None = None
    strategy: str = ""
    status: str = Field("", description="kept | dropped | no faster kernel | skipped")
    note: str = ""
    session_id: str | None = None


class ModelResult(BaseModel):
    """What ``maxkernel optimize-model`` gives: the layer's judged speedup and a row per region."""

    layer: str
    target: str
    basis: str | None = None
    correct: bool = False
    ref_ms: float | None = None
    kernel_ms: float | None = None
    speedup: float | None = None
    speedup_ci: tuple[float, float] | None = Field(None, description="the judged layer's interval")
    amdahl_bound: float = Field(1.0, description="layer speedup the kept region speedups imply, by their shares")
    judgement_reserve_s: float = Field(0.0, description="seconds of the budget the regions left for judging the "
                                                        "re-joined layer (judgement_reserve_s)")
    regions: list[RegionRow] = Field(default_factory=list)
    kernel_path: str | None = None
    returned_reference: bool = Field(False, description="nothing made the layer faster: the file is the reference")
    judged_speedup: float | None = Field(None, description="the re-joined layer's own reading, whatever was returned")
    notes: list[str] = Field(default_factory=list)
    seconds: float = 0.0


def amdahl(rows: list[RegionRow]) -> float:
    """1 / sum(share / speedup) over the regions (speedup 1 for regions left as they were)."""
    total = sum(r.share / (r.speedup if r.status == "kept" and r.speedup else 1.0) for r in rows)
    return 1.0 / total if total > 0 else 1.0


def _shapes(task: Task, extraction: Extraction) -> dict[str, list[tuple[int, ...]]]:
    """The layer's argument shapes at every size its regions hold programs for (the check ladder too)."""
    from maxkernel.analysis.program import input_shapes

    sized = {size: task if size in task.spec.sizes else task.with_size(size, values)
             for size, values in extraction.sizes.items()}
    return {size: [tuple(a.shape) for a in input_shapes(sized[size], size)] for size in sized}


RegionRunner = Callable[[RegionInfo, AutoBudget], Awaitable[AutoResult]]


def optimize_model(task: str | Path, *, out: Path, budget_s: float = 300.0, evals: int | None = None,
                   target: str = "cpu", brain: str = "rules", seed: int = 0, data_dir: str | None = None,
                   on_region: Callable[[RegionRow], None] | None = None) -> ModelResult:
    """Optimize a whole layer; writes ``out/regions/...`` and, when correct, ``out/<layer>_<target>.py``. Each
    region gets the share of ``budget_s`` and of ``evals`` that its share of the layer's time is."""
    from actors.session import prepare_brain

    config = prepare_brain(brain, data_dir=data_dir)

    async def session(info: RegionInfo, budget: AutoBudget) -> AutoResult:
        return await run_auto(info.path, config, target=target, budget=budget, mode="optimize")

    return asyncio.run(run_model(task, out=out, budget=AutoBudget(time_s=budget_s, max_evaluations=evals, seed=seed),
                                 target=target, run_region=session, on_region=on_region,
                                 rules_planner=config.brains.get("planner", config.brain) == "rules"))


async def run_model(task: str | Path, *, out: Path, budget: AutoBudget, target: str, run_region: RegionRunner,
                    evaluator: Any = None, on_region: Callable[[RegionRow], None] | None = None,
                    rules_planner: bool = True) -> ModelResult:
    """The whole-layer run on any engine: ``run_region`` runs one region's session (its own services from
    the CLI, the daemon's shared ones in a job); ``budget``'s time and evaluations are shared by the regions'
    shares of the layer's time (see ``region_budget``), its other limits hold for every region, and the time
    the re-joined layer's judgement will take is kept back from them (``judgement_reserve_s``), so the command
    ends within its budget but for what cannot be cut short: the evaluation a region's session has in flight at
    its end, and the layer's one-at-a-time retries when the whole does not pass. With the rules planner a
    region none of whose strategies applies on ``target`` gets no session (it could only return its reference). Extraction and judging run in a thread so a daemon's loop keeps renewing its
    leases."""
    started = time.perf_counter()
    layer = await asyncio.to_thread(load_task, task)
    extracting = time.perf_counter()
    extraction = await asyncio.to_thread(extract_task, layer, out / "regions", target=target)
    extract_s = time.perf_counter() - extracting
    result = ModelResult(layer=layer.id, target=target)
    deadline = started + (budget.time_s if budget.time_s is not None else 0.0)
    hottest = sorted(extraction.regions, key=lambda r: r.share, reverse=True)
    refused = {} if not rules_planner else await asyncio.to_thread(_without_strategy, extraction, target)
    pending = [r for r in hottest if r.index not in refused]
    evals_left = budget.max_evaluations
    kernels: dict[int, str] = {}
    rows: dict[int, RegionRow] = {}
    sessions: list[AutoResult] = []
    for info in hottest:
        row = RegionRow(index=info.index, task_id=info.task_id, kind=info.kind, share=info.share, budget_s=0.0,
                        before_ms=info.ms)
        rows[info.index] = row
        if info.index in refused:
            row.status, row.note = "skipped", refused[info.index]
        else:
            result.judgement_reserve_s = judgement_reserve_s(extract_s, sessions)
            row.budget_s, row.evals = region_budget(info, pending, deadline - time.perf_counter(), evals_left,
                                                    result.judgement_reserve_s)
            pending.remove(info)
            if row.budget_s < MIN_REGION_BUDGET_S:
                row.status, row.note = "skipped", f"its share of the budget ({row.budget_s:.0f} s) is too small"
            else:
                session = await run_region(info, budget.model_copy(update={"time_s": row.budget_s,
                                                                           "max_evaluations": row.evals}))
                row.session_id = session.session_id
                sessions.append(session)
                if evals_left is not None:
                    evals_left = max(0, evals_left - session.evaluations)
                _settle_region(row, info, session, kernels)
        log.info("region done", region=info.task_id, status=row.status, speedup=row.speedup)
        if on_region is not None:
            on_region(row)
    result.regions = [rows[i.index] for i in extraction.regions]

    def evaluate(task: Task, source: str, target: str) -> Any:
        return evaluate_candidate(task, source, target=target, evaluator=evaluator)

    report = await asyncio.to_thread(_judge, layer, extraction, kernels, result, target, evaluate)
    result.amdahl_bound = amdahl(result.regions)
    if report is not None and report.correct:
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"{layer.id}_{target}.py"
        path.write_text(settle(layer, extraction, kernels, report, result))
        result.kernel_path = str(path)
        result.correct = True
    elif report is not None:
        result.notes.append(f"the re-joined layer is not correct ({report.status}: {report.reason})")
    result.seconds = time.perf_counter() - started
    return result


def region_budget(info: RegionInfo, pending: list[RegionInfo], left_s: float,
                  evals: int | None, reserve_s: float = 0.0) -> tuple[float, int | None]:
    """Seconds and evaluations for ``info``: what is left of each, by its share among the regions still to
    run (``pending``, itself included), so what a region's session did not use goes to the regions after
    it and none is set aside for regions that get no session. ``reserve_s`` (``judgement_reserve_s``) is
    kept back from the seconds for the layer's judgement after them, as ``optimize``'s strategies leave
    theirs to the re-measurements (``actors.policy.share``)."""
    pool = sum(r.share for r in pending) or 1.0
    part = info.share / pool
    seconds = (policy.share(left_s - reserve_s, 1) or 0.0) * part
    return seconds, None if evals is None else max(1, round(evals * part))


def judgement_reserve_s(extract_s: float, sessions: list[AutoResult]) -> float:
    """Seconds the regions leave for judging the re-joined layer: ``optimize``'s reserve for the re-measurements
    that name a winner (``actors.policy.reserve_s``), at what one evaluation of the layer costs. That is taken
    as the larger of the extraction's time (it ran the layer and each region once) and what one evaluation
    has cost the region sessions so far: a whole layer is judged no faster than one of its regions."""
    done = sum(s.evaluations for s in sessions)
    per_region = sum(s.seconds for s in sessions) / done if done else 0.0
    return policy.reserve_s(max(extract_s, per_region))


def _without_strategy(extraction: Extraction, target: str) -> dict[int, str]:
    """The regions for which the rules planner has nothing but the reference on ``target``, and why."""
    from maxkernel.analysis import analyze_task
    from maxkernel.rules import propose_strategies

    refused: dict[int, str] = {}
    for info in extraction.regions:
        region = load_task(info.path)
        try:
            proposed = propose_strategies(region, analyze_task(region, target), target)
        except Exception as exc:  # noqa: BLE001 - the region's own session would hit the same error
            refused[info.index] = f"not analysed on {target}: {type(exc).__name__}: {exc}"
            continue
        if all(s.kind == "reference" for s in proposed):
            refused[info.index] = f"no strategy applies on {target}"
    return refused


def _settle_region(row: RegionRow, info: RegionInfo, session: AutoResult, kernels: dict[int, str]) -> None:
    """Keep the region's kernel when its session named a winner over the reference."""
    report = session.best_report
    row.strategy = session.best_strategy
    if session.beat_reference and session.best_source and report is not None and report.correct:
        kernels[info.index] = session.best_source
        row.speedup = session.confirmed_speedup or report.speedup
        row.speedup_ci = session.speedup_ci
        row.after_ms = (info.ms / row.speedup) if info.ms and row.speedup else report.kernel_ms
        row.status = "kept"
    else:
        row.status, row.note = "no faster kernel", session.note or session.stop_reason


def settle(layer: Task, extraction: Extraction, kernels: dict[int, str], report: Any, result: ModelResult) -> str:
    """The layer file to hand back, as the one engine does for a task: the re-joined layer only when its
    judged interval clears 1.0 (``faster``), else the reference itself, said so."""
    from actors.policy import claim
    from maxkernel.rules.strategy import reference_source

    result.basis, result.ref_ms, result.judged_speedup = report.basis, report.ref_ms, report.speedup
    verdict = claim(report.interval) if kernels else "not tried"
    if verdict == "faster":
        result.kernel_ms, result.speedup, result.speedup_ci = report.kernel_ms, report.speedup, report.interval
        return report_source(layer, extraction, kernels)
    why = ("no region kernel was kept" if not kernels
           else f"the re-joined layer is {verdict} ({format_speedup(report.speedup, report.interval)})" if report.speedup
           else "no reading")
    result.notes.append(f"{why}: the reference itself is returned")
    result.returned_reference = True
    result.kernel_ms, result.speedup, result.speedup_ci = report.ref_ms, 1.0, None
    return reference_source(layer)


def report_source(layer: Task, extraction: Extraction, kernels: dict[int, str]) -> str:
    return splice(extraction, kernels, _shapes(layer, extraction))


def _judge(layer: Task, extraction: Extraction, kernels: dict[int, str], result: ModelResult, target: str,
           evaluate: Any) -> Any:
    """Judge the spliced layer; when it fails, add the region kernels back one at a time, hottest first,
    keeping each only if the whole stays correct. ``kernels`` is left holding the ones kept."""
    shapes = _shapes(layer, extraction)
    report = evaluate(layer, splice(extraction, kernels, shapes), target=target)
    if report.correct or not kernels:
        return report
    result.notes.append(f"the layer with all {len(kernels)} region kernels failed ({report.status}: "
                        f"{report.reason}); trying them one at a time")
    trial = dict(kernels)
    kept: dict[int, str] = {}
    order = sorted(trial, key=lambda i: extraction.regions[i].share, reverse=True)
    best = None
    for index in order:
        attempt = {**kept, index: trial[index]}
        candidate = evaluate(layer, splice(extraction, attempt, shapes), target=target)
        row = next(r for r in result.regions if r.index == index)
        if candidate.correct:
            kept, best = attempt, candidate
        else:
            row.status, row.note = "dropped", f"breaks the whole layer: {candidate.status}: {candidate.reason}"
            result.notes.append(f"region {index} ({row.kind}) dropped: it breaks the whole layer")
    kernels.clear()
    kernels.update(kept)
    if best is None:
        best = evaluate(layer, splice(extraction, {}, shapes), target=target)
    return best
