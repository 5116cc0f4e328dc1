"""What the store knows about how strategies and their parameters fared, read back from the event log.

The event log is the record of every judged candidate: a draft's ``EvalReport``/``FixRequest`` carries
the strategy (name, kind, parameters, what each block parameter tiles) and the full report; a
``TuneReport`` carries every tuning trial's parameters and outcome. ``measurements`` flattens both into
one row per measured configuration; the rest ranks tasks by similarity and sums up strategy outcomes.
Tuning trials are also answered as tool ``EvalReport``s, which carry the untuned parameters: those are
skipped, their trials are read from the ``TuneReport`` instead.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from pydantic import BaseModel, Field

# Kinds whose outcome says nothing about another task: a recalled kernel is that task's own code.
UNTRANSFERABLE_KINDS = frozenset({"recalled", "tool-check"})
JUDGED = ("EvalReport", "FixRequest")
TUNED = "TuneReport"
PLANNED = "Plan"
FAMILY_PRIMITIVES = frozenset({"dot_general", "ragged_dot_general", "conv_general_dilated", "scan", "while",
                               "gather", "scatter", "scatter-add", "cumsum"})
OTHER_FAMILY = 0.5  # what a task of another op family weighs against its structural similarity


class Measurement(BaseModel):
    """One measured configuration of one strategy on one task."""

    task_id: str
    session_id: str | None = None
    target: str
    strategy: str
    kind: str = ""
    params: dict[str, Any] = Field(default_factory=dict)
    extents: dict[str, int] = Field(default_factory=dict)
    space: dict[str, list[Any]] = Field(default_factory=dict)
    status: str
    correct: bool = False
    speedup: float | None = Field(None, description="the lower end of the speedup's interval (the point when it has "
                                                      "none): memory ranks by what a reading surely reached")
    speedup_high: float | None = Field(None, description="the upper end of that interval (the point when it has none): "
                                                           "a reading is surely slower only when this is")
    label: str = ""
    reason: str = ""
    tuned: bool = Field(False, description="a tuning trial rather than the plan's own draft")
    confirmation: bool = Field(False, description="the session's re-measurement of one of its top candidates")

    @property
    def passed(self) -> bool:
        return self.status == "ok" and self.correct


class TaskMatch(BaseModel):
    task_id: str
    score: float


class StrategyOutcome(BaseModel):
    """How one strategy fared on one recalled task (every session of that task on the target)."""

    task_id: str
    similarity: float
    strategy: str
    kind: str = ""
    evaluations: int
    passed: int
    best_speedup: float | None = Field(None, description="the lower end of its best reading; for a strategy the "
                                                           "session re-measured, the lowest of those re-measurements")
    best_high: float | None = Field(None, description="the upper end of the reading(s) behind best_speedup")
    won: bool = Field(False, description="its best beat every other strategy's and the reference")
    reason: str = Field("", description="why it failed, when it never passed")


def _current(plan: dict[str, Any]) -> dict[str, Any] | None:
    strategies = plan.get("strategies") or []
    step = int(plan.get("step") or 0)
    return strategies[step] if 0 <= step < len(strategies) else None


def _from_ref(ref: dict[str, Any], **fields: Any) -> Measurement:
    return Measurement(strategy=ref.get("name", ""), kind=ref.get("kind", ""), extents=dict(ref.get("extents") or {}),
                       space=dict(ref.get("space") or {}), **fields)


def measurements_from_events(events: Iterable[Any]) -> list[Measurement]:
    """Rows from recorded events (``EventRecord``-like: ``message_type``, ``payload``, ``session_id``), in order.

    A ``TuneReport`` names only its strategy; its kind and extents come from the session's plans.
    """
    refs: dict[tuple[str | None, str], dict[str, Any]] = {}
    out: list[Measurement] = []
    for event in events:
        payload = event.payload
        session = event.session_id
        if event.message_type == PLANNED:
            for ref in payload.get("strategies") or []:
                refs[(session, ref.get("name", ""))] = ref
            continue
        if event.message_type in JUDGED:
            draft = payload.get("draft") or {}
            produced_by = str(draft.get("produced_by", ""))
            if produced_by.endswith(":tool"):
                continue
            plan = draft.get("plan") or {}
            ref = _current(plan)
            report = payload.get("report") or {}
            if ref is None:
                continue
            refs.setdefault((session, ref.get("name", "")), ref)
            out.append(_from_ref(ref, task_id=payload.get("task_id", ""), session_id=session,
                                 target=report.get("target") or plan.get("target", "cpu"),
                                 params=dict(ref.get("params") or {}), status=report.get("status", ""),
                                 correct=bool(report.get("correct")), speedup=_lower_end(report),
                                 speedup_high=_upper_end(report), confirmation=produced_by.endswith(":confirm"),
                                 label=report.get("label") or "", reason=(report.get("reason") or "")[:300]))
        elif event.message_type == TUNED:
            name = payload.get("strategy", "")
            ref = refs.get((session, name), {"name": name})
            target = (payload.get("best_report") or {}).get("target", "cpu")
            for trial in payload.get("trials") or []:
                out.append(_from_ref(ref, task_id=payload.get("task_id", ""), session_id=session, target=target,
                                     params=dict(trial.get("params") or {}), status=trial.get("status", ""),
                                     correct=trial.get("status") == "ok", speedup=trial.get("speedup"), tuned=True))
    return out


def _lower_end(report: dict[str, Any]) -> float | None:
    interval = report.get("speedup_ci")
    return float(interval[0]) if interval else report.get("speedup")


def _upper_end(report: dict[str, Any]) -> float | None:
    interval = report.get("speedup_ci")
    return float(interval[1]) if interval else report.get("speedup")


def op_family(primitives: Iterable[str]) -> frozenset[str]:
    """The primitives that decide which kernels fit a task (a contraction, a convolution, a loop, an
    indexed read or write): tasks with the same set are built the same way, whatever their epilogue."""
    return frozenset(p for p in primitives if p in FAMILY_PRIMITIVES)


def rank_tasks(query: np.ndarray, vectors: dict[str, np.ndarray], k: int,
               families: dict[str, frozenset[str]] | None = None,
               family: frozenset[str] | None = None) -> list[TaskMatch]:
    """The ``k`` tasks whose vectors are closest to ``query`` (cosine; vectors are unit length). With
    ``families``, a task of another op family than ``family`` counts ``OTHER_FAMILY`` times its cosine: it
    ranks behind the tasks of the same family and weighs less in the priors."""
    def score(tid: str, vec: np.ndarray) -> float:
        cosine = float(np.dot(query, vec))
        if families is None or family is None or families.get(tid) == family:
            return cosine
        return cosine * OTHER_FAMILY

    scored = [TaskMatch(task_id=tid, score=score(tid, vec)) for tid, vec in vectors.items()]
    scored.sort(key=lambda m: (-m.score, m.task_id))
    return scored[:k]


def _held(readings: Sequence[Measurement]) -> tuple[float | None, float | None]:
    """What a strategy's correct readings on one task say it reached: the lower and upper end of its best
    reading; where the session re-measured it, the lowest lower end and highest upper end of the
    re-measurements (a reading that did not hold up there is not kept as the strategy's best)."""
    confirmed = [r for r in readings if r.confirmation]
    if confirmed:
        lows = [r.speedup for r in confirmed if r.speedup is not None]
        return min(lows), max(r.speedup_high or r.speedup or 0.0 for r in confirmed)
    if not readings:
        return None, None
    best = max(readings, key=lambda r: r.speedup or 0.0)
    return best.speedup, max(best.speedup_high or 0.0, best.speedup or 0.0)


def strategy_outcomes(rows: Sequence[Measurement], matches: Sequence[TaskMatch]) -> list[StrategyOutcome]:
    """Per recalled task and strategy: evaluations, passes, best correct speedup, and whether it won there.

    A strategy won on a task when its best correct speedup is the task's highest and above 1.0 (a
    kernel that only matches the reference won nothing). Reference-equivalent results do not count as
    wins for the strategy that produced them. A strategy the session measured again before naming a winner
    (the engine's confirmation runs) counts by what those re-measurements held, not by its luckiest reading.
    """
    similarity = {m.task_id: m.score for m in matches}
    groups: dict[tuple[str, str], list[Measurement]] = defaultdict(list)
    for row in rows:
        if row.task_id in similarity and row.kind not in UNTRANSFERABLE_KINDS and not row.strategy.startswith("recall:"):
            groups[(row.task_id, row.strategy)].append(row)
    outcomes: list[StrategyOutcome] = []
    for (task_id, strategy), group in groups.items():
        ok = [r for r in group if r.passed and r.speedup is not None]
        real = [r for r in ok if r.label != "reference-equivalent" and r.speedup is not None]
        failed = [r for r in group if not r.passed]
        best, high = _held(real)
        outcomes.append(StrategyOutcome(
            task_id=task_id, similarity=similarity[task_id], strategy=strategy, kind=group[0].kind,
            evaluations=len(group), passed=len(ok), best_speedup=best,
            best_high=high, reason="" if ok else (failed[-1].reason or failed[-1].status)))
    best_of_task: dict[str, float] = {}
    for o in outcomes:
        if o.best_speedup is not None and o.kind != "reference":
            best_of_task[o.task_id] = max(best_of_task.get(o.task_id, 0.0), o.best_speedup)
    for o in outcomes:
        top = best_of_task.get(o.task_id)
        o.won = (o.kind != "reference" and o.best_speedup is not None and top is not None
                 and o.best_speedup >= top and o.best_speedup > 1.0)
    outcomes.sort(key=lambda o: (-o.similarity, o.task_id, -(o.best_speedup or 0.0), o.strategy))
    return outcomes
