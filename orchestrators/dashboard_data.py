"""What the dashboard's pages show, read from the store: jobs with their progress and speedup, sessions and
searches with their best readings, one job's, session's or search's evaluations (its chart, graph and best
kernel beside the reference), memory's kernels and notes, and the fleet's processes.

Every figure here comes from the same readers as the HTML reports (``orchestrators.report`` and
``orchestrators.report_data``), so a page and a report never disagree about a speedup.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from actors.policy import describe
from jaxbench.report import format_speedup
from jaxbench.task import TaskError, load_task
from memory import Store
from memory.errors import RecordNotFoundError
from memory.schema import EventRow, KernelRow
from orchestrators.graph import EVALUATION_TYPES, Node, load_graph
from orchestrators.jobs import JobInfo
from orchestrators.report import ReportData, UnknownSubject, gather, judged_source
from orchestrators.report_data import Contribution, contributions, highest_low, sessions_nodes
from orchestrators.tables import ensure, searches

LIVE_JOB = ("queued", "running", "cancelling")


def evaluation_counts(store: Store, session_ids: list[str]) -> dict[str, int]:
    """Evaluations judged so far per session (one counting query, nothing parsed)."""
    if not session_ids:
        return {}
    with store.read("counting evaluations") as s:
        rows = s.execute(sa.select(EventRow.session_id, sa.func.count()).where(EventRow.session_id.in_(session_ids))
                         .where(EventRow.message_type.in_(EVALUATION_TYPES)).group_by(EventRow.session_id)).all()
    return {str(sid): int(n) for sid, n in rows}


def _ago(when: datetime) -> float:
    return (datetime.now(UTC) - (when if when.tzinfo else when.replace(tzinfo=UTC))).total_seconds()


@dataclass
class Progress:
    """How far a piece of work is: evaluations against their cap, seconds against the budget's."""

    done: int
    cap: int | None
    elapsed_s: float | None = None
    budget_s: float | None = None

    @property
    def percent(self) -> int:
        shares = [self.done / self.cap] if self.cap else []
        if self.elapsed_s is not None and self.budget_s:
            shares.append(self.elapsed_s / self.budget_s)
        return int(100 * min(1.0, max(shares, default=0.0)))

    @property
    def text(self) -> str:
        out = f"{self.done}/{self.cap} evaluations" if self.cap else f"{self.done} evaluations"
        if self.elapsed_s is not None and self.budget_s:
            out += f" · {min(self.elapsed_s, self.budget_s):.0f}/{self.budget_s:.0f} s"
        return out


@dataclass
class JobView:
    job: JobInfo
    progress: Progress
    speedup: str = "-"
    claim: str = ""
    strategy: str = ""
    reason: str = ""
    so_far: bool = False  # the speedup is the best reading so far of a job still running

    @property
    def live(self) -> bool:
        return self.job.status in LIVE_JOB


def job_view(store: Store, job: JobInfo, counts: dict[str, int] | None = None) -> JobView:
    """A job with its progress and its speedup: the result's once it ended, the best reading so far (by the
    lower end of its interval, as the report ranks) while it runs."""
    counts = counts if counts is not None else evaluation_counts(store, job.sessions)
    done = sum(counts.get(s, 0) for s in job.sessions)
    elapsed = None
    if job.status == "running" and job.sessions:
        try:
            elapsed = _ago(store.get_session(job.sessions[0]).created_at)
        except RecordNotFoundError:  # named by the daemon, its first record not written yet
            elapsed = 0.0
    view = JobView(job=job, progress=Progress(done, job.budget.max_evaluations, elapsed, job.budget.time_s))
    result = job.result or {}
    view.reason = job.error or result.get("stop_reason") or "; ".join(result.get("notes") or [])
    if result:
        value = result.get("confirmed_speedup") or result.get("speedup")
        view.speedup = format_speedup(value, result.get("speedup_ci"))
        view.claim = result.get("claim") or ""
        view.strategy = result.get("best_strategy") or ("layer" if result.get("layer") else "")
    elif job.status == "running" and done:
        best = highest_low(sessions_nodes(store, job.sessions))
        if best is not None:
            view.speedup, view.strategy, view.so_far = format_speedup(best.speedup, best.interval), best.strategy, True
    return view


def job_views(store: Store, jobs: list[JobInfo]) -> list[JobView]:
    counts = evaluation_counts(store, [s for j in jobs for s in j.sessions])
    return [job_view(store, j, counts) for j in jobs]


@dataclass
class SessionView:
    id: str
    task_id: str
    mode: str
    brain: str
    target: str
    status: str
    created_at: datetime
    evaluations: int
    best: str
    strategy: str


BestCache = dict[str, tuple[Any, Node | None]]  # id -> (what it was read at, its best node)


def _best_of_session(store: Store, session_id: str, count: int, cache: BestCache) -> Node | None:
    """A session's best node, read again only when it judged more evaluations since (a list page polled every
    few seconds parses each session's events once, not at every poll)."""
    if count == 0:
        return None
    seen = cache.get(session_id)
    if seen is None or seen[0] != count:
        seen = cache[session_id] = (count, highest_low(sessions_nodes(store, [session_id])))
    return seen[1]


def session_views(store: Store, limit: int = 100, cache: BestCache | None = None) -> list[SessionView]:
    """The newest sessions with how many evaluations each judged and its best reading."""
    cache = {} if cache is None else cache
    infos = store.sessions(limit=limit)
    counts = evaluation_counts(store, [i.id for i in infos])
    out = []
    for info in infos:
        best = _best_of_session(store, info.id, counts.get(info.id, 0), cache)
        out.append(SessionView(id=info.id, task_id=info.task_id or "", mode=info.mode, brain=info.brain,
                               target=info.target, status=info.status, created_at=info.created_at,
                               evaluations=counts.get(info.id, 0),
                               best=format_speedup(best.speedup, best.interval) if best else "-",
                               strategy=best.strategy if best else ""))
    for gone in set(cache) - {i.id for i in infos}:  # only what the page lists is kept
        cache.pop(gone, None)
    return out


@dataclass
class SearchView:
    id: str
    task_id: str
    algorithm: str
    status: str
    created_at: datetime
    expansions: int
    evaluations: int
    best: str
    strategy: str
    confirmed: bool


def search_views(store: Store, limit: int = 100, cache: dict[str, tuple[Any, SearchView]] | None = None) -> list[SearchView]:
    """The newest searches with their best node (by confirmed lower end, as the search itself names it); a search
    that ended is read once (``cache``: id -> (its last update, its row)), one that runs at every call."""
    cache = {} if cache is None else cache
    ensure(store.engine)
    with store.engine.connect() as conn:
        rows = conn.execute(sa.select(searches.c.id, searches.c.created_at, searches.c.status, searches.c.updated_at)
                            .order_by(searches.c.created_at.desc()).limit(limit)).all()
    out = []
    for search_id, created, status, updated in rows:
        seen = cache.get(search_id)
        if seen is not None and status != "running" and seen[0] == (status, updated):
            out.append(seen[1])
            continue
        graph = load_graph(store, search_id)
        best = graph.best()
        view = SearchView(id=search_id, task_id=graph.task_id, algorithm=graph.algorithm, status=graph.status,
                          created_at=created, expansions=len(graph.expansions), evaluations=len(graph.nodes),
                          best=format_speedup(best.speedup, best.interval) if best else "-",
                          strategy=best.strategy if best else "", confirmed=bool(best and best.confirmed is not None))
        cache[search_id] = ((status, updated), view)
        out.append(view)
    for gone in set(cache) - {r[0] for r in rows}:
        cache.pop(gone, None)
    return out


@dataclass
class SubjectView:
    """One job, session or search: its facts, every evaluation in order (the chart's points), its graph's
    version, and the best kernel's code beside the reference's."""

    kind: str
    id: str
    task_id: str
    title: str
    status: str
    live: bool
    facts: dict[str, Any]
    nodes: list[Node]
    best: Node | None = None
    best_why: str = ""
    best_facts: list[tuple[str, Any]] = field(default_factory=list)
    best_code: str = ""
    reference_code: str = ""
    contributions: list[Contribution] = field(default_factory=list)
    recalled: list[str] = field(default_factory=list)
    job: JobView | None = None
    seconds: dict[int, float] = field(default_factory=dict)  # an evaluation's seq -> seconds since the work began

    @property
    def graph_key(self) -> str:
        """Changes whenever the graph's picture would: a new node, or another best."""
        return f"{len(self.nodes)}-{self.best.candidate_id if self.best else 'none'}"

    def points(self) -> list[dict[str, Any]]:
        """The chart's data: each evaluation in the order judged, and the best lower end so far after it."""
        out, running = [], None
        for i, n in enumerate(sorted(self.nodes, key=lambda n: n.seq), start=1):
            if n.passed and n.speedup and (running is None or n.low > running):
                running = n.low
            out.append({"n": i, "t": self.seconds.get(n.seq), "speedup": n.speedup if n.passed else None, "low": n.low if n.passed else None,
                        "high": (n.interval[1] if n.interval else n.speedup) if n.passed else None, "passed": n.passed, "strategy": n.strategy,
                        "status": n.status, "best_low": running})
        return out


def seconds_since_start(store: Store, nodes: list[Node]) -> dict[int, float]:
    """When each evaluation was recorded, in seconds since the first message of its work's sessions."""
    if not nodes:
        return {}
    sessions = sorted({n.session_id for n in nodes})
    with store.read("reading when evaluations were judged") as s:
        start = s.scalar(sa.select(sa.func.min(EventRow.created_at)).where(EventRow.session_id.in_(sessions)))
        when = dict(s.execute(sa.select(EventRow.seq, EventRow.created_at)
                              .where(EventRow.seq.in_([n.seq for n in nodes]))).all())
    return {seq: (at - start).total_seconds() for seq, at in when.items()} if start is not None else {}


def reference_source(task_id: str) -> str:
    """The task's ``reference.py`` (empty when the task cannot be found here)."""
    try:
        return load_task(task_id).reference_path.read_text()
    except (TaskError, OSError, ValueError):
        return ""


def subject_view(store: Store, subject: str, job: JobInfo | None = None) -> SubjectView:
    """A job's, session's or search's page data (``orchestrators.report.gather`` finds which it is)."""
    try:
        data = gather(store, subject)
    except UnknownSubject:
        if job is None:
            raise
        # a job that has just started: its session is named before the session's first record is written
        data = ReportData(kind="job", id=job.id, task_id=job.task_id, title="daemon job", nodes=[],
                          facts={"job status": job.status, "priority": job.priority, "attempts": job.attempts})
    if data.kind == "search":
        status = str(data.facts.get("status", ""))
        live = status == "running"
    elif job is not None:
        status, live = job.status, job.status in LIVE_JOB
    else:
        status = str(data.facts.get("status", ""))
        live = status == "running"
    view = SubjectView(kind=data.kind, id=data.id, task_id=data.task_id, title=data.title, status=status, live=live,
                       facts=data.facts, nodes=data.nodes, best_why=data.best_why, recalled=data.recalled,
                       contributions=contributions(data.nodes), reference_code=reference_source(data.task_id),
                       job=job_view(store, job) if job is not None else None,
                       seconds=seconds_since_start(store, data.nodes))
    view.best = data.best
    if view.best is not None:
        best = view.best
        view.best_code, report = judged_source(store, best)
        view.best_facts = [("why this one", data.best_why), ("strategy", best.strategy), ("params", best.params or "-"),
                           ("speedup", format_speedup(best.speedup, best.interval)),
                           ("claim", describe(best.speedup, best.interval)),
                           ("kernel ms", f"{best.kernel_ms:.4g}" if best.kernel_ms else "-"),
                           ("reference ms", f"{report.ref_ms:.4g}" if report.ref_ms else "-"),
                           ("basis", report.basis or "-"), ("max abs err", report.max_abs_err),
                           ("checks", ", ".join(f"{c.name}:{'ok' if c.passed else 'FAIL'}" for c in report.checks) or "-")]
    return view


@dataclass
class MemoryView:
    query: str
    target: str
    kernels: list[dict[str, Any]]
    notes: list[Any]
    targets: list[str]
    page: int = 0
    more: bool = False  # older kernels or notes than this page's


def memory_view(store: Store, query: str = "", target: str = "", page: int = 0, limit: int = 50) -> MemoryView:
    """One page (``limit`` of each, newest first) of memory's kernels and notes, those containing ``query``
    (task, strategy, code or note text) on ``target`` when given."""
    found = store.list_kernels(text=query or None, target=target or None, limit=limit + 1, offset=page * limit)
    kernels = [{"k": k, "speed": format_speedup(k.speedup, k.report.interval), "lines": k.code.count("\n") + 1}
               for k in found[:limit]]
    all_notes = store.list_notes(text=query or None, limit=limit + 1, offset=page * limit)
    more = len(found) > limit or len(all_notes) > limit
    notes = [n for n in all_notes[:limit] if not target or n.target in (None, target)]
    with store.read("listing targets") as s:
        targets = sorted(str(t) for t in s.scalars(sa.select(KernelRow.target).distinct()))
    return MemoryView(query=query, target=target, kernels=kernels, notes=notes, targets=targets, page=page, more=more)


def fleet_root(data_path: Path) -> Path | None:
    """The fleet this daemon belongs to (a supervised daemon's folder is ``<fleet>/daemons/<n>``), or the one
    started from this data folder (``<data dir>/fleet``); None when no fleet runs."""
    from orchestrators import fleet

    for root in (data_path.parent.parent if data_path.parent.name == "daemons" else None, data_path / "fleet"):
        if root is not None and fleet.read(root) is not None:
            return root
    return None


def fleet_processes(data_path: Path) -> tuple[Path, list[dict[str, Any]]] | None:
    """``(root, rows of fleet.status)`` of the fleet found from ``data_path``, or None."""
    from orchestrators import fleet

    root = fleet_root(data_path)
    if root is None:
        return None
    try:
        return root, fleet.status(root)
    except fleet.FleetError:
        return None
