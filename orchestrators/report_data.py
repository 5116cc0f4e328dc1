"""What a session's event log says it evaluated, per candidate and per strategy.

The report and the note remembered at the end of a run (a daemon job's included) both read their figures
here, from the same events, so that they never disagree about evaluations or speedups.
"""

from __future__ import annotations

from pydantic import BaseModel

from jaxbench.report import format_speedup
from memory import Store
from orchestrators.graph import EVALUATION_TYPES, ROOT, Node, judged_params, niche, written_at


def session_nodes(store: Store, session_id: str) -> list[Node]:
    """An Auto/HITL/daemon session's evaluated candidates, with the edges the event log implies."""
    nodes = []
    events = store.events(session_id=session_id)
    known = written_at(events)
    for event in events:
        if event.message_type not in EVALUATION_TYPES:
            continue
        draft, report = event.payload["draft"], event.payload["report"]
        ref = draft["plan"]["strategies"][draft["plan"]["step"]]
        tool = draft.get("produced_by", "").endswith(":tool")
        parent = draft.get("parent_id") or ROOT
        edge = "tune" if tool else "fix" if draft.get("parent_id") else f"apply {ref['name']}"
        params = judged_params(draft, known)
        nodes.append(Node(candidate_id=event.candidate_id or draft["candidate_id"], session_id=session_id,
                          parent_id=parent, edge=edge, strategy=ref["name"], params=params,
                          status=report["status"], passed=report["status"] == "ok" and bool(report["correct"]),
                          speedup=report.get("speedup"), speedup_ci=report.get("speedup_ci"),
                          kernel_ms=report.get("kernel_ms"), label=report.get("label"), basis=report.get("basis"),
                          reason=(report.get("reason") or "")[:300], niche=niche(ref["name"], params), seq=event.seq,
                          produced_by=draft.get("produced_by", "")))
    return nodes


def sessions_nodes(store: Store, session_ids: list[str]) -> list[Node]:
    """The nodes of several sessions (a job's attempts), in order."""
    return [n for s in session_ids for n in session_nodes(store, s)]


def highest_low(nodes: list[Node]) -> Node | None:
    """The passing candidate with the highest lower end of its interval: a lucky reading never wins."""
    return max((n for n in nodes if n.passed), key=lambda n: n.low, default=None)


def reading_of(nodes: list[Node], candidate_id: str | None) -> Node | None:
    """The one reading shown for a candidate judged more than once (a first reading and its re-measurements):
    the passing one with the highest lower end, as :func:`highest_low` ranks, else its last. The report's table,
    the dashboard and the graph's label all show this one, so they never name two figures for one kernel."""
    mine = [n for n in nodes if n.candidate_id == candidate_id]
    return highest_low(mine) or (max(mine, key=lambda n: n.seq) if mine else None)


class Contribution(BaseModel):
    """One strategy's share of the work: evaluations, how many were correct, its best reading (by the lower
    end of the interval), whether that reading is the overall best, and the last failure's reason."""

    strategy: str
    evaluations: int = 0
    correct: int = 0
    best: Node | None = None
    winner: bool = False
    status: str = ""
    reason: str = ""

    @property
    def low(self) -> float:
        return self.best.low if self.best is not None else 0.0

    @property
    def shown(self) -> str:
        return format_speedup(self.best.speedup, self.best.interval) if self.best is not None else "-"

    def line(self) -> str:
        """The strategy in one line of a note."""
        if self.best is not None:
            at = f" at {self.best.params}" if self.best.params else ""
            return f"{self.strategy}: correct, best {self.shown}{at} ({self.evaluations} evaluation{'' if self.evaluations == 1 else 's'})"
        return f"{self.strategy}: {self.status} — {self.reason[:240]} ({self.evaluations} evaluation{'' if self.evaluations == 1 else 's'})"


def contributions(nodes: list[Node]) -> list[Contribution]:
    """Per strategy, best first (by the lower end of its best reading)."""
    best = highest_low(nodes)
    rows: dict[str, Contribution] = {}
    for n in sorted(nodes, key=lambda n: n.seq):
        row = rows.setdefault(n.strategy, Contribution(strategy=n.strategy))
        row.evaluations += 1
        if n.passed:
            row.correct += 1
            if row.best is None or n.low > row.best.low:
                row.best = n
        else:
            row.status, row.reason = n.status, n.reason
    for row in rows.values():
        row.winner = best is not None and row.strategy == best.strategy
    return sorted(rows.values(), key=lambda r: -r.low)
