"""What each kill of the chaos benchmark cost, read from the store (jobs, their sessions, events) and the fleet's
logs, so that a run says where its phase with kills lost time, per kind of kill.

- daemon: the attempts it cut (sessions that were running and were followed by another attempt of their
  job), how long each had run, how long since its last recorded message (work after it is redone or adopted)
  and how long until the job ran again;
- worker: the evaluations the host had in flight on it and how long each waited until it was dispatched to
  another tester;
- chroma: how often and how long the daemons waited for the server to write to memory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from statistics import mean
from typing import Any


@dataclass
class Attempt:
    job: str
    start: float  # unix seconds: the session's creation
    last: float  # its last recorded event
    next_start: float | None  # the job's next attempt, if any


def _unix(moment: datetime) -> float:
    return moment.timestamp()


def attempts(store: Any, jobs: list[Any]) -> list[Attempt]:
    """Every attempt (session) of ``jobs``, with when it started, its last record and when the next began."""
    out: list[Attempt] = []
    for job in jobs:
        starts = [_unix(store.get_session(s).created_at) for s in job.sessions]
        for i, session_id in enumerate(job.sessions):
            events = store.events(session_id=session_id)
            last = max((_unix(e.created_at) for e in events), default=starts[i])
            out.append(Attempt(job.id, starts[i], last, starts[i + 1] if i + 1 < len(starts) else None))
    return out


def _log(path: Path) -> list[tuple[float, dict[str, Any]]]:
    """A structlog JSON log's events with their unix times (other lines left out)."""
    out: list[tuple[float, dict[str, Any]]] = []
    if not path.exists():
        return out
    for line in path.read_text(errors="replace").splitlines():
        if not line.startswith("{"):
            continue
        try:
            event = json.loads(line)
            out.append((datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp(), event))
        except (ValueError, KeyError):
            continue
    return out


def _stats(values: list[float]) -> dict[str, float]:
    return {"n": len(values), "mean_s": round(mean(values), 2), "max_s": round(max(values), 2)} if values else {"n": 0}


def daemon_costs(cut: list[Attempt], kills: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per daemon kill: the attempts it cut, each attributed to the last daemon kill before its successor."""
    rows: list[dict[str, Any]] = [{"at": k["at"], "cut": []} for k in kills]
    for attempt in cut:
        assert attempt.next_start is not None
        before = [i for i, k in enumerate(kills) if attempt.start <= k["unix"] <= attempt.next_start + 0.5]
        if not before:
            continue
        kill = kills[before[-1]]
        rows[before[-1]]["cut"].append({
            "job": attempt.job[:8], "ran_s": round(kill["unix"] - attempt.start, 2),
            "unrecorded_s": round(max(0.0, kill["unix"] - attempt.last), 2),
            "resumed_after_s": round(max(0.0, attempt.next_start - kill["unix"]), 2)})
    return rows


def worker_costs(host_log: list[tuple[float, dict[str, Any]]], kills: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per worker kill: the evaluations the host took back from it and how long each waited for another tester."""
    rows = []
    for kill in kills:
        lost = [(t, e) for t, e in host_log
                if e["event"] == "host.worker_lost" and kill["unix"] - 0.5 <= t <= kill["unix"] + 5]
        waits: list[float] = []
        if lost:
            lost_at = lost[0][0]
            again = [e for t, e in host_log if e["event"] == "host.redelivered" and lost_at <= t <= lost_at + 0.5]
            for redelivered in again:
                source = redelivered.get("source")
                sent = [t for t, e in host_log
                        if e["event"] == "host.dispatched" and e.get("source") == source and t >= lost_at]
                if sent:
                    waits.append(round(sent[0] - lost_at, 2))
        rows.append({"at": kill["at"], "in_flight": int(lost[0][1].get("in_flight", 0)) if lost else 0,
                     "redispatched_after_s": waits})
    return rows


def chroma_costs(daemon_log: list[tuple[float, dict[str, Any]]], kills: list[dict[str, Any]],
                 phase_end: float) -> list[dict[str, Any]]:
    """Per Chroma kill: the daemons' waits for memory (retries of a write or of opening) until the next kill."""
    rows = []
    for i, kill in enumerate(kills):
        until = kills[i + 1]["unix"] if i + 1 < len(kills) else phase_end
        waits = [t for t, e in daemon_log if e["event"] == "daemon.memory_waiting" and kill["unix"] <= t < until]
        rows.append({"at": kill["at"], "memory_waits": len(waits),
                     "waited_s": round(waits[-1] - waits[0] + 0.25, 2) if waits else 0.0})
    return rows


def kill_costs(store_url: str, ids: list[str], kill_log: list[dict[str, Any]], logs: Path,
               phase_end: float) -> dict[str, Any]:
    """Per kind of kill, what each cost (see the module's doc), with a summary of each kind."""
    from memory import Store
    from orchestrators.jobs import JobQueue

    with Store.open(store_url) as store:
        queue = JobQueue(store.engine)
        spans = attempts(store, [queue.get(i) for i in ids])
    of_kind = {kind: [k for k in kill_log if k["kind"] == kind] for kind in ("daemon", "worker", "chroma")}
    daemons = daemon_costs([a for a in spans if a.next_start is not None], of_kind["daemon"])
    workers = worker_costs(_log(logs / "host.log"), of_kind["worker"])
    chroma = chroma_costs(_log(logs / "daemons.stderr.log"), of_kind["chroma"], phase_end)
    cut = [c for row in daemons for c in row["cut"]]
    return {
        "attempt_seconds": round(sum(a.last - a.start for a in spans), 1),
        "daemon": {"kills": daemons, "cut": len(cut), "ran": _stats([c["ran_s"] for c in cut]),
                   "unrecorded": _stats([c["unrecorded_s"] for c in cut]),
                   "resumed_after": _stats([c["resumed_after_s"] for c in cut])},
        "worker": {"kills": workers, "in_flight": sum(w["in_flight"] for w in workers),
                   "redispatched_after": _stats([s for w in workers for s in w["redispatched_after_s"]])},
        "chroma": {"kills": chroma, "memory_waits": sum(c["memory_waits"] for c in chroma),
                   "waited": _stats([c["waited_s"] for c in chroma if c["memory_waits"]])},
    }
