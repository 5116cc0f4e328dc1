"""Chaos on a local fleet: jobs worked through while a seeded killer SIGKILLs daemons, tester workers and
the Chroma server, each replaced (daemons and workers by their supervisors, from warm spares); then the
same number of jobs without kills, side by side.

    python benchmarks/fleet_chaos.py --jobs 20 --kills 30 --json chaos.json

Loopback only (``orchestrators.fleet``), bounded in count (``--jobs``, ``--kills``) and time
(``--deadline``). The daemons' jobs are judged by the supervised tester workers through the gRPC host.
Once the fleet is up and a few uncounted jobs have warmed every process, the jobs with kills run, then as
many without (what memory learns meanwhile favours the second). It reports ``lost`` (jobs that ended
without being done), ``unfinished`` (jobs still queued or running at the deadline), ``duplicated`` (a
candidate's verdict recorded twice in a session, or a kernel judged again in a later attempt of a job
although an earlier attempt had recorded its verdict: an evaluation cut off by a kill and run again
counts once; the confirmation runs that a resumed job makes again are counted apart, as
``reconfirmed``), whether the memory is consistent (every kernel and note in SQL has its vector on the
Chroma server and every vector its record) and ``throughput_ratio`` (jobs per minute with kills over
without, each phase's jobs done within it over its length), with where each phase's time went:
``kill_costs`` (what each kill cut, from the store and the logs) and ``cpu_seconds`` (the CPU each kind of
process used in each phase, ``benchmarks/chaos_cpu.py``).
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

from benchmarks.chaos_costs import kill_costs  # noqa: E402
from benchmarks.chaos_cpu import CpuSampler  # noqa: E402
from orchestrators import fleet  # noqa: E402

TASKS = ("41k_Gemm_Add_ReLU", "12p_RMSNorm", "21k_Gemm_Divide_Sum_Scaling")


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


def _verdicts(store: Any, session_id: str) -> tuple[Counter[str], set[str]]:
    """A session's tester verdicts: per candidate, the judgements (confirmation runs aside), and the
    candidates it confirmed."""
    from actors.policy import CONFIRM

    judged: Counter[str] = Counter()
    confirmed: set[str] = set()
    for event in store.events(session_id=session_id):
        if event.message_type not in ("EvalReport", "FixRequest") or not event.candidate_id:
            continue
        if event.payload.get("sender") != "tester":
            continue
        if (event.payload.get("draft") or {}).get("produced_by") == CONFIRM:
            confirmed.add(event.candidate_id)
        else:
            judged[event.candidate_id] += 1
    return judged, confirmed


def _audit(store_url: str, ids: list[str]) -> dict[str, Any]:
    """Jobs not done; verdicts recorded twice in a session, and kernels a job judged again in a later
    attempt although an earlier attempt had recorded their verdict; confirmation runs made again."""
    import sqlalchemy as sa

    from memory import Store
    from memory.schema import CandidateRow
    from orchestrators.jobs import JobQueue

    def shas(store: Store, candidates: set[str]) -> set[str]:
        if not candidates:
            return set()
        with store.engine.connect() as conn:
            return set(conn.execute(sa.select(CandidateRow.code_sha).where(CandidateRow.id.in_(candidates))).scalars())

    with Store.open(store_url) as store:
        queue = JobQueue(store.engine)
        jobs = [queue.get(i) for i in ids]
        duplicated = reconfirmed = evaluations = 0
        for job in jobs:
            earlier: set[str] = set()
            earlier_confirmed: set[str] = set()
            for session_id in job.sessions:
                judged, confirmed = _verdicts(store, session_id)
                evaluations += sum(judged.values()) + len(confirmed)
                duplicated += sum(n - 1 for n in judged.values())
                kernels, confirmed_kernels = shas(store, set(judged)), shas(store, confirmed)
                duplicated += len(kernels & earlier)
                reconfirmed += len(confirmed_kernels & earlier_confirmed)
                earlier |= kernels
                earlier_confirmed |= confirmed_kernels
        statuses = Counter(j.status for j in jobs)
    return {"lost": sum(1 for j in jobs if j.status != "done"), "duplicated": duplicated, "reconfirmed": reconfirmed,
            "unfinished": sum(1 for j in jobs if j.status in ("queued", "running", "cancelling")),
            "evaluations": evaluations, "statuses": dict(statuses), "attempts": sum(j.attempts for j in jobs),
            "taken_over": sum(1 for j in jobs if j.attempts > 1)}


class Killer:
    """SIGKILLs a seeded random serving daemon, serving tester worker or the Chroma server every ``every_s``
    seconds and starts the Chroma server again (the supervisors replace daemons and workers themselves, from
    their warm spares when they have one)."""

    def __init__(self, state: fleet.FleetState, seed: int, kills: int, every_s: float) -> None:
        self.state, self.rng, self.left, self.every_s = state, random.Random(seed), kills, every_s
        self.began = time.monotonic()
        self.next_at = self.began + every_s
        self.done: Counter[str] = Counter()
        self.log: list[dict[str, Any]] = []  # each kill: seconds into the phase, unix time, kind, pid

    def _serving(self, name: str) -> list[int]:
        """Pids serving a slot of supervisor ``name``: an idle spare on standby would be a kill that costs nothing."""
        supervisor = next((p for p in self.state.procs if p.name == name), None)
        return [pid for pid in fleet.serving_workers(supervisor).values() if fleet.alive(pid)] if supervisor else []

    def tick(self) -> None:
        if self.left <= 0 or time.monotonic() < self.next_at:
            return
        self.next_at = time.monotonic() + self.every_s
        procs = self.state.procs
        daemons, workers = self._serving("daemons"), self._serving("testers")
        kinds = ["daemon"] * bool(daemons) + ["worker"] * bool(workers) + ["chroma"]
        kind = self.rng.choice(kinds)
        at, unix = round(time.monotonic() - self.began, 1), time.time()
        if kind == "daemon":
            pid = self.rng.choice(daemons)
            os.killpg(pid, signal.SIGKILL)
        elif kind == "worker":
            pid = self.rng.choice(workers)
            os.killpg(pid, signal.SIGKILL)
        else:
            chroma = next(p for p in procs if p.name == "chroma")
            pid = chroma.pid
            os.killpg(chroma.pid, signal.SIGKILL)
            gone = time.monotonic() + 5
            while fleet.alive(chroma.pid) and time.monotonic() < gone:  # its port is free once it is reaped
                time.sleep(0.02)
            procs[procs.index(chroma)] = fleet.start_chroma(Path(self.state.root), chroma.port)
        self.left -= 1
        self.done[kind] += 1
        self.log.append({"at": at, "unix": round(unix, 3), "kind": kind, "pid": pid})
        fleet.write(self.state)


def run(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="maxkernel-chaos-"))
    # Every process of the fleet inherits these: small evaluations, since what is measured is the fleet.
    os.environ["MAXKERNEL_EVAL_TIMING_ROUNDS"] = str(args.timing_rounds)
    os.environ["MAXKERNEL_EVAL_CORRECTNESS_SEEDS"] = str(args.seeds)
    began = time.monotonic()
    sampler = CpuSampler().start()  # the fleet's processes are this one's descendants
    state = fleet.up(root, daemons=args.daemons, testers=args.testers, concurrency=args.concurrency,
                     spares=args.spares, daemon_spares=args.daemon_spares)
    try:
        hard_end = began + args.deadline
        fleet.wait_ready(state, testers=args.testers, spares=args.spares if args.testers else 0,
                         timeout_s=max(hard_end - time.monotonic(), 1))
        # A few jobs first, not counted: every process's first compilations are paid before either phase.
        warm_ids = _submit(state.store_url, args.warmup, args.seed + 2, args.evals, args.job_seconds)
        _wait_done(state.store_url, warm_ids, hard_end)
        # With kills, then without: each phase's jobs are its own, and what memory learns favours the second.
        killer = Killer(state, args.seed, args.kills, args.every)
        chaos_ids = _submit(state.store_url, args.jobs, args.seed + 1, args.evals, args.job_seconds)
        start, utc = time.monotonic(), [time.time()]
        calm_reserve = max(90.0, 0.25 * (hard_end - start))
        chaos_end = _wait_done(state.store_url, chaos_ids, hard_end - calm_reserve, killer.tick)
        chaos_done = args.jobs - _audit(state.store_url, chaos_ids)["lost"]  # jobs done within the phase
        chaos_rate = chaos_done / max(chaos_end - start, 1e-9) * 60
        utc.append(utc[0] + chaos_end - start)
        calm_ids = _submit(state.store_url, args.jobs, args.seed, args.evals, args.job_seconds)
        start = time.monotonic()
        utc.append(time.time())
        calm_end = _wait_done(state.store_url, calm_ids, hard_end)
        calm_done = args.jobs - _audit(state.store_url, calm_ids)["lost"]
        calm_rate = calm_done / max(calm_end - start, 1e-9) * 60  # a phase cut off at the deadline: no tail
        utc.append(utc[2] + calm_end - start)
        calm, chaos = _audit(state.store_url, calm_ids), _audit(state.store_url, chaos_ids)
        warm = _audit(state.store_url, warm_ids)
        costs = {"with_kills": kill_costs(state.store_url, chaos_ids, killer.log, root / "logs", utc[1]),
                 "without_kills": kill_costs(state.store_url, calm_ids, [], root / "logs", utc[3])}
        memory = fleet.memory_audit(state.store_url, state.chroma_url)
        sampler.stop()
        cpu = {"with_kills": sampler.seconds(utc[0], utc[1]), "without_kills": sampler.seconds(utc[2], utc[3])}
    finally:
        sampler.stop()
        try:
            fleet.down(root)
        except fleet.FleetError:  # every process already gone
            pass
    # Lost: a job that ended without being done (failed, cancelled); one still queued or running when the
    # deadline came is counted apart, as unfinished (the run was cut off, or the job is stuck).
    phases = (chaos, calm, warm)
    return {"jobs": args.jobs, "kills": sum(killer.done.values()), "kills_by_kind": dict(killer.done),
            "lost": sum(p["lost"] - p["unfinished"] for p in phases),
            "unfinished": {"with_kills": chaos["unfinished"], "without_kills": calm["unfinished"],
                           "warmup": warm["unfinished"]},
            "duplicated": chaos["duplicated"] + calm["duplicated"] + warm["duplicated"],
            "reconfirmed": chaos["reconfirmed"] + calm["reconfirmed"],
            "memory_consistent": memory.consistent, "memory": memory.model_dump(),
            "jobs_per_min_without_kills": round(calm_rate, 3), "jobs_per_min_with_kills": round(chaos_rate, 3),
            "throughput_ratio": round(chaos_rate / calm_rate, 3) if calm_rate else None,
            "done_in_phase": {"with_kills": chaos_done, "without_kills": calm_done},
            "seconds": round(time.monotonic() - began, 1), "kill_log": killer.log, "kill_costs": costs,
            "cpu_seconds": cpu,
            "phases_unix": {"with_kills": utc[0:2], "without_kills": utc[2:4]},
            "without_kills": calm, "with_kills": chaos, "warmup": warm, "folder": str(root)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--kills", type=int, default=30)
    parser.add_argument("--every", type=float, default=4.0, help="seconds between kills")
    parser.add_argument("--daemons", type=int, default=2)
    parser.add_argument("--testers", type=int, default=3)
    parser.add_argument("--spares", type=int, default=1, help="standby tester workers kept warm by the supervisor")
    parser.add_argument("--daemon-spares", type=int, default=1, help="standby daemons kept warm by the daemons' "
                        "supervisor, each taking a killed daemon's place at once")
    parser.add_argument("--concurrency", type=int, default=2, help="jobs each daemon runs at once")
    parser.add_argument("--timing-rounds", type=int, default=3, help="timing rounds of each evaluation")
    parser.add_argument("--seeds", type=int, default=1, help="correctness input sets of each evaluation")
    parser.add_argument("--evals", type=int, default=2, help="evaluations each job may spend")
    parser.add_argument("--job-seconds", type=float, default=20.0, help="time budget of each job")
    parser.add_argument("--deadline", type=float, default=560.0, help="seconds the phases may take (the fleet's "
                        "start included; stopping it and the audit come after)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warmup", type=int, default=2, help="jobs run first and not counted")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if min(args.jobs, args.daemons, args.concurrency) < 1 or min(args.kills, args.spares, args.daemon_spares) < 0:
        parser.error("--jobs, --daemons and --concurrency must be at least 1, --kills, --spares and --daemon-spares "
                     "at least 0")
    # A run stopped with SIGTERM (or Ctrl-C) takes its fleet down with it: SystemExit unwinds through run()'s
    # `finally`, which stops every process it started.
    signal.signal(signal.SIGTERM, lambda _sig, _frame: sys.exit(143))
    result = run(args)
    print(json.dumps({k: v for k, v in result.items() if k not in ("without_kills", "with_kills")}, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    passed = (result["lost"] == 0 and result["duplicated"] == 0 and result["memory_consistent"]
              and result["unfinished"]["with_kills"] == 0)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
