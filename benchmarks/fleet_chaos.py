"""Chaos on a local fleet: jobs worked through while a seeded killer SIGKILLs daemons, tester workers and
the Chroma server, restarting each; then the same number of jobs without kills, side by side.

    python benchmarks/fleet_chaos.py --jobs 20 --kills 30 --json chaos.json

Loopback only (``orchestrators.fleet``), bounded in count (``--jobs``, ``--kills``) and time
(``--deadline``). It reports ``lost`` (jobs not done by the end), ``duplicated`` (kernels a job judged
again in a later attempt although an earlier attempt had recorded their verdict: an evaluation cut off
by a kill and run again counts once) and ``throughput_ratio`` (jobs per minute with
kills over without).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrators import fleet  # noqa: E402

TASKS = ("41k_Gemm_Add_ReLU", "12p_RMSNorm", "21k_Gemm_Divide_Sum_Scaling")


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _submit(store_url: str, count: int, seed: int, evals: int, seconds: float) -> list[str]:
    from memory import Store
    from orchestrators.auto import AutoBudget
    from orchestrators.jobs import JobQueue, JobSpec

    rng = random.Random(seed)
    with Store.open(store_url) as store:
        queue = JobQueue(store.engine)
        return [queue.submit(JobSpec(task=rng.choice(TASKS), budget=AutoBudget(time_s=seconds, max_evaluations=evals)))
                .id for _ in range(count)]


def _wait_done(store_url: str, ids: list[str], deadline: float, tick: Any = None) -> float:
    from memory import Store
    from orchestrators.jobs import JobQueue

    with Store.open(store_url) as store:
        queue = JobQueue(store.engine)
        while time.monotonic() < deadline:
            if all(queue.get(i).status in ("done", "failed", "cancelled") for i in ids):
                return time.monotonic()
            if tick is not None:
                tick()
            time.sleep(0.5)
    return time.monotonic()


def _audit(store_url: str, ids: list[str]) -> dict[str, Any]:
    """Jobs not done, and kernels a job judged again in a later attempt although an earlier attempt had
    recorded their verdict (the engine's own confirmation runs inside one session are not repeats)."""
    import sqlalchemy as sa

    from memory import Store
    from memory.schema import CandidateRow
    from orchestrators.jobs import JobQueue

    with Store.open(store_url) as store:
        queue = JobQueue(store.engine)
        jobs = [queue.get(i) for i in ids]
        duplicated = 0
        for job in jobs:
            earlier: set[str] = set()
            for session_id in job.sessions:
                events = [e for e in store.events(session_id=session_id)
                          if e.message_type in ("EvalReport", "FixRequest") and e.candidate_id]
                with store.engine.connect() as conn:
                    shas = set(conn.execute(sa.select(CandidateRow.code_sha).where(
                        CandidateRow.id.in_({e.candidate_id for e in events}))).scalars()) if events else set()
                duplicated += len(shas & earlier)
                earlier |= shas
        statuses = Counter(j.status for j in jobs)
    return {"lost": sum(1 for j in jobs if j.status != "done"), "duplicated": duplicated, "statuses": dict(statuses),
            "attempts": sum(j.attempts for j in jobs)}


class Killer:
    """SIGKILLs a seeded random daemon, tester worker or the Chroma server every ``every_s`` seconds and
    starts the daemon or Chroma server again (the supervisor restarts the worker itself)."""

    def __init__(self, state: fleet.FleetState, seed: int, kills: int, every_s: float, lease_s: float) -> None:
        self.state, self.rng, self.left, self.every_s, self.lease_s = state, random.Random(seed), kills, every_s, lease_s
        self.next_at = time.monotonic() + every_s
        self.done: Counter[str] = Counter()

    def tick(self) -> None:
        if self.left <= 0 or time.monotonic() < self.next_at:
            return
        self.next_at = time.monotonic() + self.every_s
        procs = self.state.procs
        daemons = [p for p in procs if p.name.startswith("daemon-")]
        supervisor = next((p for p in procs if p.name == "testers"), None)
        workers = _children(supervisor.pid) if supervisor else []
        kinds = ["daemon"] * bool(daemons) + ["worker"] * bool(workers) + ["chroma"]
        kind = self.rng.choice(kinds)
        if kind == "daemon":
            victim = self.rng.choice(daemons)
            os.killpg(victim.pid, signal.SIGKILL)
            index = int(victim.name.split("-")[1])
            procs[procs.index(victim)] = fleet.start_daemon(self.state, index, lease_s=self.lease_s)
        elif kind == "worker":
            os.killpg(self.rng.choice(workers), signal.SIGKILL)
        else:
            chroma = next(p for p in procs if p.name == "chroma")
            os.killpg(chroma.pid, signal.SIGKILL)
            time.sleep(0.5)
            procs[procs.index(chroma)] = fleet.start_chroma(Path(self.state.root), chroma.port)
        self.left -= 1
        self.done[kind] += 1
        fleet.write(self.state)


def run(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="maxkernel-chaos-"))
    state = fleet.up(root, daemons=args.daemons, testers=args.testers)
    lease_s = 10.0
    try:
        hard_end = time.monotonic() + args.deadline
        # Without kills first, then with: each phase's jobs are its own.
        calm_ids = _submit(state.store_url, args.jobs, args.seed, args.evals, args.job_seconds)
        start = time.monotonic()
        calm_end = _wait_done(state.store_url, calm_ids, start + (hard_end - start) / 2)
        calm_rate = args.jobs / max(calm_end - start, 1e-9) * 60
        calm_complete = _audit(state.store_url, calm_ids)["lost"] == 0  # else its rate is a lower bound
        killer = Killer(state, args.seed, args.kills, args.every, lease_s)
        chaos_ids = _submit(state.store_url, args.jobs, args.seed + 1, args.evals, args.job_seconds)
        start = time.monotonic()
        chaos_end = _wait_done(state.store_url, chaos_ids, hard_end, killer.tick)
        chaos_rate = args.jobs / max(chaos_end - start, 1e-9) * 60
        calm, chaos = _audit(state.store_url, calm_ids), _audit(state.store_url, chaos_ids)
    finally:
        try:
            fleet.down(root)
        except fleet.FleetError:  # every process already gone
            pass
    return {"jobs": args.jobs, "kills": sum(killer.done.values()), "kills_by_kind": dict(killer.done),
            "lost": chaos["lost"] + calm["lost"], "duplicated": chaos["duplicated"] + calm["duplicated"],
            "jobs_per_min_without_kills": round(calm_rate, 3), "jobs_per_min_with_kills": round(chaos_rate, 3),
            "throughput_ratio": round(chaos_rate / calm_rate, 3) if calm_rate else None,
            "calm_phase_complete": calm_complete,
            "without_kills": calm, "with_kills": chaos, "folder": str(root)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--kills", type=int, default=30)
    parser.add_argument("--every", type=float, default=4.0, help="seconds between kills")
    parser.add_argument("--daemons", type=int, default=2)
    parser.add_argument("--testers", type=int, default=3)
    parser.add_argument("--evals", type=int, default=3, help="evaluations each job may spend")
    parser.add_argument("--job-seconds", type=float, default=30.0, help="time budget of each job")
    parser.add_argument("--deadline", type=float, default=600.0, help="seconds the whole run may take")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if min(args.jobs, args.daemons) < 1 or args.kills < 0:
        parser.error("--jobs and --daemons must be at least 1, --kills at least 0")
    result = run(args)
    print(json.dumps({k: v for k, v in result.items() if k not in ("without_kills", "with_kills")}, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0 if result["lost"] == 0 and result["duplicated"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
