"""The search graph, read back from the store: nodes are evaluated candidates with their reports, edges
the strategy that led from a parent to a child.

Nothing here is kept in memory between runs: the expansions table says which session applied which
strategy to which parent, and each session's events say what was evaluated. That is what makes a search
resumable after ``kill -9``: whatever was evaluated is in the event log, exactly once.
"""

from __future__ import annotations

import json
import math
import uuid
from typing import Any

import sqlalchemy as sa
from pydantic import BaseModel, Field

from actors import policy
from jaxbench.candidate import source_sha
from jaxbench.report import EvalReport as JudgeReport, SpeedupInterval
from memory import Store
from orchestrators.tables import ensure, expansions, searches

ROOT = "root"
EVALUATION_TYPES = ("EvalReport", "FixRequest")
CONFIRM_SESSION = "confirm"
_NS = uuid.UUID("6f1d1c52-58a4-4c8f-9a53-2f0b0d7c1e11")


class Node(SpeedupInterval, BaseModel):
    candidate_id: str
    session_id: str
    expansion: int | None = None
    parent_id: str
    edge: str
    strategy: str
    params: dict[str, Any] = Field(default_factory=dict)
    status: str
    passed: bool
    speedup: float | None = None
    speedup_ci: tuple[float, float] | None = None
    kernel_ms: float | None = None
    label: str | None = None
    reason: str = ""
    niche: str = ""
    lane: int = 0
    seq: int = 0
    produced_by: str = ""
    basis: str | None = None
    cleared: float | None = Field(None, description="what must clear 1.0 for the node to be called faster: its lower "
                                                    "end against the search's baseline (actors.policy.cleared)")
    confirm_runs: list[float] = Field(default_factory=list, description="the re-measurements, each as cleared is")

    @property
    def over(self) -> float:
        """``cleared``, or the lower end where no baseline was measured."""
        return self.low if self.cleared is None else self.cleared

    @property
    def confirmed(self) -> float | None:
        """What clears the bar after re-measurement (``actors.policy``); a modelled one stands as it is."""
        if self.speedup is None or not self.passed:
            return None
        if self.basis is not None and self.basis != "measured":
            return self.low
        if not self.confirm_runs:
            return None
        return policy.confirmed([self.over, *self.confirm_runs])


class Expansion(BaseModel):
    n: int
    round: int
    session_id: str
    parent_id: str | None
    strategy: str
    params: dict[str, Any]
    edge: str
    lane: int
    status: str


class SearchGraph(BaseModel):
    search_id: str
    task_id: str
    algorithm: str
    config: dict[str, Any]
    status: str
    expansions: list[Expansion]
    nodes: list[Node]
    baseline_runs: list[JudgeReport] = Field(default_factory=list, description="the reference run as a candidate")

    @property
    def baseline(self) -> JudgeReport | None:
        """The baseline run that counts (``actors.policy.baseline_bar``), or None before one was measured."""
        return policy.baseline_of(self.baseline_runs)

    def node(self, candidate_id: str) -> Node:
        return next(n for n in self.nodes if n.candidate_id == candidate_id)

    @property
    def valid(self) -> list[Node]:
        return [n for n in self.nodes if n.passed]

    def best(self) -> Node | None:
        """The best node by confirmed lower end; by first reading's only when no node has been confirmed."""
        confirmed = [n for n in self.valid if n.confirmed is not None]
        if confirmed:
            return max(confirmed, key=lambda n: n.confirmed or 0.0)
        return max(self.valid, key=lambda n: n.low, default=None)

    def result_of(self, expansion: Expansion) -> Node | None:
        """An expansion's best valid node (its draft, or the debugger's fix of it)."""
        mine = [n for n in self.nodes if n.expansion == expansion.n and n.passed]
        return max(mine, key=lambda n: n.low, default=None)


def session_for(search_id: str, n: int | str) -> str:
    """The session of a search's expansion ``n`` (or of its plan or its confirmation runs): stable ids, so
    that a resumed search finds what its killed run recorded."""
    return uuid.uuid5(_NS, f"{search_id}:{n}").hex


def confirm_session(search_id: str) -> str:
    return session_for(search_id, CONFIRM_SESSION)


def shown(params: dict[str, Any]) -> dict[str, Any]:
    """Parameters without a recalled kernel's whole source (the strategy name already names it)."""
    return {k: v for k, v in params.items() if k != "source"}


def written_at(events: list[Any]) -> dict[str, dict[str, Any]]:
    """The parameters each judged code was written at, by the code's hash: a tuned kernel's from its tuning
    report (the tuner's best, which its plan does not carry), a draft's or a fix's from its own plan."""
    known: dict[str, dict[str, Any]] = {}
    for event in events:
        if event.message_type == "TuneReport":
            known[source_sha(event.payload["best_source"])] = shown(dict(event.payload.get("best_params") or {}))
    for event in events:
        if event.message_type in EVALUATION_TYPES:
            draft = event.payload["draft"]
            if not _rejudged(draft):
                known.setdefault(source_sha(draft["source"]), plan_params(draft))
    return known


def judged_params(draft: dict[str, Any], known: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The parameters of the code an evaluation judged (``known``: :func:`written_at`). A tuning trial or a
    re-measurement carries the plan of the draft it came from, not the parameters its code was written at: it
    gets its code's known parameters, else none, never its plan's."""
    if not _rejudged(draft):
        return plan_params(draft)
    return known.get(source_sha(draft["source"]), {})


def plan_params(draft: dict[str, Any]) -> dict[str, Any]:
    plan = draft["plan"]
    return shown(dict(plan["strategies"][plan["step"]].get("params") or {}))


def _rejudged(draft: dict[str, Any]) -> bool:
    """Judged under a plan that did not write it: a tuning trial (written at the trial's parameters), or a
    re-measurement (the baseline, a confirmation)."""
    produced_by = draft.get("produced_by", "")
    return produced_by.startswith("tuner:") or produced_by in (policy.CONFIRM, policy.BASELINE)


def params_key(strategy: str, params: dict[str, Any]) -> str:
    return f"{strategy} {json.dumps(shown(params), sort_keys=True, default=str)}"


def block_class(params: dict[str, Any]) -> str:
    """The block-size class of a parameter set: the log4 bucket of the product of its block sizes."""
    sizes = [int(v) for k, v in params.items() if isinstance(v, int) and not isinstance(v, bool) and "block" in k]
    if not sizes:
        return "-"
    return f"b{int(math.log(max(1, math.prod(sizes)), 4))}"


def niche(strategy: str, params: dict[str, Any]) -> str:
    """Behaviour niche of evolve's archive: the op strategy × the block-size class."""
    return f"{strategy}|{block_class(params)}"


def load_graph(store: Store, search_id: str) -> SearchGraph:
    ensure(store.engine)
    with store.engine.connect() as conn:
        row = conn.execute(sa.select(searches).where(searches.c.id == search_id)).first()
        if row is None:
            raise LookupError(f"no search {search_id!r} in {store.where}")
        rows = conn.execute(sa.select(expansions).where(expansions.c.search_id == search_id)
                            .order_by(expansions.c.n)).all()
    exps = [Expansion.model_validate(dict(r._mapping)) for r in rows]
    again: list[tuple[str, JudgeReport]] = []
    baseline_runs: list[JudgeReport] = []
    for event in store.events(session_id=confirm_session(search_id)):
        if event.message_type == "EvalReport" and event.candidate_id:
            report = JudgeReport.model_validate(event.payload["report"])
            if (event.payload.get("draft") or {}).get("produced_by") == policy.BASELINE:
                baseline_runs.append(report)
            else:
                again.append((event.candidate_id, report))
    baseline = policy.baseline_of(baseline_runs)
    confirm_runs: dict[str, list[float]] = {}
    for candidate_id, report in again:
        confirm_runs.setdefault(candidate_id, []).append(policy.cleared(report, baseline))
    nodes: list[Node] = []
    for exp in exps:
        events = store.events(session_id=exp.session_id)
        known = written_at(events)
        for event in events:
            if event.message_type not in EVALUATION_TYPES:
                continue
            draft, report = event.payload["draft"], event.payload["report"]
            own_parent = draft.get("parent_id")
            nodes.append(Node(
                candidate_id=event.candidate_id or draft["candidate_id"], session_id=exp.session_id, expansion=exp.n,
                parent_id=own_parent or exp.parent_id or ROOT, edge="fix" if own_parent else exp.edge,
                strategy=exp.strategy, params=judged_params(draft, known), status=report["status"],
                passed=report["status"] == "ok" and bool(report["correct"]), speedup=report.get("speedup"),
                speedup_ci=report.get("speedup_ci"), kernel_ms=report.get("kernel_ms"), label=report.get("label"), reason=(report.get("reason") or "")[:300],
                niche=niche(exp.strategy, exp.params), lane=exp.lane, seq=event.seq,
                produced_by=draft.get("produced_by", ""), basis=report.get("basis"),
                confirm_runs=confirm_runs.get(event.candidate_id or draft["candidate_id"], [])))
            nodes[-1].cleared = policy.cleared(nodes[-1], baseline) if baseline is not None else None
    return SearchGraph(search_id=search_id, task_id=row.task_id, algorithm=row.algorithm, config=row.config,
                       status=row.status, expansions=exps, nodes=nodes, baseline_runs=baseline_runs)
