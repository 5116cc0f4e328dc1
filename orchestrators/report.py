"""HTML reports of a session, a search or a daemon job, read back from the store's event log.

One self-contained file: the best kernel and its judge's report, the candidate graph as a picture,
speedup over the evaluations, and what each strategy contributed. Pictures are matplotlib PNGs embedded
as base64, so the file can be mailed or archived alone.

Which kernel is "best" is the one the work named: a chat session's accepted kernel (with undo taken into
account), a search's confirmed best, else the candidate whose speedup interval has the highest lower end.
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from pydantic import BaseModel

from actors.policy import describe
from jaxbench.report import EvalReport, format_speedup
from memory import Store
from memory.errors import RecordNotFoundError
from orchestrators import report_graph
from orchestrators.graph import Node, load_graph
from orchestrators.report_data import Contribution, contributions, highest_low, reading_of, sessions_nodes
from orchestrators.tables import ensure, jobs, searches


class ReportData(BaseModel):
    kind: str
    id: str
    task_id: str
    title: str
    facts: dict[str, Any]
    nodes: list[Node]
    best_id: str | None = None
    best_why: str = ""
    recalled: list[str] = []

    @property
    def best(self) -> Node | None:
        """The named kernel's reading, the one the graph stars and labels (``report_data.reading_of``)."""
        return reading_of(self.nodes, self.best_id) if self.best_id else None


class UnknownSubject(LookupError):
    """Neither a session, a search nor a job."""


def gather(store: Store, subject: str) -> ReportData:
    """Find ``subject`` (a job, a search or a session id) and read what the report needs."""
    ensure(store.engine)
    with store.engine.connect() as conn:
        job = conn.execute(sa.select(jobs).where(jobs.c.id == subject)).first()
        search = conn.execute(sa.select(searches.c.id).where(searches.c.id == subject)).first()
    if search is not None:
        graph = load_graph(store, subject)
        facts = {"algorithm": graph.algorithm, "status": graph.status, "expansions": len(graph.expansions),
                 "evaluations": len(graph.nodes)} | {k: graph.config[k] for k in ("seed", "max_evaluations", "target")}
        best = graph.best()
        return ReportData(kind="search", id=subject, task_id=graph.task_id, title=f"{graph.algorithm} search",
                          facts=facts, nodes=graph.nodes, best_id=best.candidate_id if best else None,
                          best_why="the search's best by confirmed lower end" if best and best.confirmed is not None
                          else "the highest lower end (not confirmed)")
    sessions = [subject]
    facts: dict[str, Any] = {}
    if job is not None:
        sessions = list(job.sessions or [])
        facts = {"job status": job.status, "priority": job.priority, "attempts": job.attempts}
        if not sessions:
            return ReportData(kind="job", id=subject, task_id=job.task_id, title="daemon job", facts=facts, nodes=[])
    try:
        infos = [store.get_session(s) for s in sessions]
    except RecordNotFoundError as exc:
        raise UnknownSubject(f"{subject!r} is no session, search or job in {store.where}") from exc
    info = infos[-1]
    events = [e for s in sessions for e in store.events(session_id=s)]
    facts |= {"mode": info.mode, "brain": info.brain, "target": info.target, "status": info.status,
              "started": info.created_at.strftime("%Y-%m-%d %H:%M:%S UTC")}
    if events:
        facts["duration"] = f"{(events[-1].created_at - events[0].created_at).total_seconds():.1f} s"
    nodes = sessions_nodes(store, sessions)
    facts["evaluations"] = len(nodes)
    best_id, why = named_best(info.mode, events, nodes)
    return ReportData(kind="job" if job is not None else "session", id=subject, task_id=info.task_id or "",
                      title=f"{'daemon job' if job is not None else info.mode + ' session'}", facts=facts, nodes=nodes,
                      best_id=best_id, best_why=why, recalled=recalled(events))


def named_best(mode: str, events: list[Any], nodes: list[Node]) -> tuple[str | None, str]:
    """The kernel the session named and why: a chat's accepted one, else the highest lower end."""
    if mode == "hitl":
        from orchestrators.hitl import accepted_candidate

        accepted = accepted_candidate(events)
        if accepted is not None and any(n.candidate_id == accepted for n in nodes):
            return accepted, "accepted in the chat"
    best = highest_low(nodes)
    if best is None:
        return None, ""
    why = "not accepted: the highest lower end" if mode == "hitl" else "the highest lower end of its interval"
    return best.candidate_id, why


def recalled(events: list[Any]) -> list[str]:
    """What memory handed the session: ``kernel <id> (<task>)`` and ``note <id>`` lines."""
    out: list[str] = []
    for event in events:
        if event.message_type != "Recall":
            continue
        out += [f"kernel {k['id']} ({k['task_id']}, {k.get('strategy') or '-'}, score {k['score']:.2f})"
                for k in event.payload.get("kernels") or []]
        out += [f"note {n['id']} ({n['outcome']}): {n['text'][:120]}" for n in event.payload.get("notes") or []]
    return list(dict.fromkeys(out))


def judged_source(store: Store, node: Node) -> tuple[str, EvalReport]:
    """The source a node's evaluation judged and the judge's report, read from that evaluation's event."""
    event = store.events(after=node.seq - 1, limit=1)[0]
    return event.payload["draft"]["source"], EvalReport.model_validate(event.payload["report"])


# -- pictures --------------------------------------------------------------------------------------


def _png(fig: Any) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return base64.b64encode(buffer.getvalue()).decode()


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def graph_png(nodes: list[Node], best: str | None) -> str:
    """The candidate graph (``orchestrators.report_graph``) as an embedded PNG."""
    return _png(report_graph.figure(nodes, best))


def best_so_far(ordered: list[Node]) -> list[float]:
    """After each evaluation, the highest lower end of a passing candidate's interval so far (NaN before the
    first): the curve ranks as the report does, so a lucky reading never shows as the best."""
    out, running = [], None
    for n in ordered:
        if n.passed and n.speedup and (running is None or n.low > running):
            running = n.low
        out.append(running if running is not None else float("nan"))
    return out


def speedup_png(nodes: list[Node]) -> str:
    plt = _plt()
    ordered = sorted(nodes, key=lambda n: n.seq)
    xs = list(range(1, len(ordered) + 1))
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ok = [(x, n.speedup) for x, n in zip(xs, ordered) if n.passed and n.speedup]
    best = best_so_far(ordered)
    if ok:
        ax.scatter([p[0] for p in ok], [p[1] for p in ok], s=16, c="#2a9d4b", label="correct candidate")
    bad = [x for x, n in zip(xs, ordered) if not n.passed]
    if bad:
        ax.scatter(bad, [0] * len(bad), s=16, c="#d1495b", marker="x", label="rejected")
    ax.step(xs, best, where="post", c="#1d3557", label="best so far (lower end)")
    ax.axhline(1.0, ls="--", c="#999", lw=1)
    ax.set_xlabel("evaluation")
    ax.set_ylabel("speedup over reference")
    ax.legend(fontsize=7)
    return _png(fig)


def contributions_png(rows: list[Contribution]) -> str:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 0.6 + 0.45 * max(1, len(rows))))
    names = [r.strategy[:40] for r in rows]
    ax.barh(names, [r.low for r in rows], color=["#2a9d4b" if r.winner else "#8ab6d6" for r in rows])
    ax.axvline(1.0, ls="--", c="#999", lw=1)
    ax.set_xlabel("best speedup (lower end of the 95% interval)")
    ax.invert_yaxis()
    return _png(fig)


# -- the page --------------------------------------------------------------------------------------


def _table(rows: list[tuple[str, Any]]) -> str:
    return "<table>" + "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>"
                               for k, v in rows) + "</table>"


def render(store: Store, subject: str) -> str:
    data = gather(store, subject)
    best = data.best
    parts = [f"<h1>{html.escape(data.title)} {html.escape(data.id)} · {html.escape(data.task_id)}</h1>",
             _table(list(data.facts.items()))]
    if best is None:
        parts.append("<h2>Best kernel</h2><p>No correct candidate.</p>")
    else:
        code, report = judged_source(store, best)
        facts = [("why this one", data.best_why), ("candidate", best.candidate_id), ("strategy", best.strategy),
                 ("params", best.params), ("speedup", format_speedup(best.speedup, best.interval)),
                 ("claim", describe(best.speedup, best.interval)),
                 ("kernel ms", best.kernel_ms), ("label", best.label), ("reference ms", report.ref_ms),
                 ("basis", report.basis), ("cv", report.cv), ("max abs err", report.max_abs_err),
                 ("checks", ", ".join(f"{c.name}:{'ok' if c.passed else 'FAIL'}" for c in report.checks))]
        parts += ["<h2>Best kernel</h2>", _table(facts), f"<pre>{html.escape(code)}</pre>"]
    if data.recalled:
        parts += ["<h2>Recalled from memory</h2><ul>" + "".join(f"<li>{html.escape(r)}</li>" for r in data.recalled)
                  + "</ul>"]
    if data.nodes:
        rows = contributions(data.nodes)
        parts += ["<h2>Search graph</h2>",
                  "<p>Each node: strategy · speedup interval · status; the best path is drawn thick (★ the best); "
                  "dashed edges are fixes, dotted ones tuning steps.</p>",
                  f'<img alt="graph" src="data:image/png;base64,{graph_png(data.nodes, data.best_id)}">',
                  "<h2>Speedup over time</h2>",
                  f'<img alt="speedup" src="data:image/png;base64,{speedup_png(data.nodes)}">',
                  "<h2>What each strategy contributed</h2>",
                  f'<img alt="strategies" src="data:image/png;base64,{contributions_png(rows)}">',
                  "<table><tr><th>strategy</th><th>evaluations</th><th>correct</th><th>best (ranked by the lower end)"
                  "</th><th>best overall</th></tr>"
                  + "".join(f"<tr><td>{html.escape(r.strategy)}</td><td>{r.evaluations}</td><td>{r.correct}</td>"
                            f"<td>{html.escape(r.shown)}</td><td>{'yes' if r.winner else ''}</td></tr>"
                            for r in rows) + "</table>"]
    style = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto}table{border-collapse:collapse;margin:1em 0}"
             "th,td{border:1px solid #ccc;padding:3px 8px;text-align:left}pre{background:#f6f6f6;padding:1em;"
             "overflow:auto}img{max-width:100%}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>MaxKernel report {html.escape(data.id[:12])}"
            f"</title><style>{style}</style></head><body>{''.join(parts)}</body></html>")


def write_report(store: Store, subject: str, out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(store, subject), encoding="utf-8")
    return out
