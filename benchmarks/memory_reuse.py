"""Memory reuse: does an Auto session that starts from memory of *other* tasks reach a good kernel sooner?

Every measured task runs **cold** (an empty memory of its own) and **warm** (a memory filled from the cold
runs of the tasks outside its fold). Tasks are split round-robin into ``--folds`` folds; a warm run sees
the other folds' memory only (its kernels, notes and every recorded evaluation, which the strategy
priors, parameter priors and learned cost model read), never its fold-mates'. ``--warm`` adds tasks that
only fill memory. Each session gets ``--budget`` evaluations. Speedups are confirmed: the best kernel of
each run is measured again ``--confirm`` times, the median is its figure and (max - min) / median its
noise (both in the table and the JSON).

``--min-cold-evals K`` measures warm only the tasks whose cold run first reached its confirmed best at
evaluation K or later (and whose best beats the reference); the rest only fill memory. The choice is made
from the cold runs alone, before any warm run, and printed: a task whose cold best comes at evaluation 1
leaves a ratio that can never drop below 1, and says nothing about whether memory finds things sooner.

Per task: evaluations and seconds to the first correct kernel and to the cold run's confirmed best (a
reading within ``--tolerance`` of it, or the cold winner's own kernel measured: the cold run reaches its best
where it first measured the kernel it returned), and each run's final confirmed best. ``ratio``, over the tasks whose cold confirmed
best is not the reference (nor a kernel that confirms at or below 1.0x, which does not beat it): warm's total evaluations to reach the cold confirmed best (``budget + 1`` when
it never does) over cold's. Targets: ratio at most 0.33; warm's confirmed best at least cold's within the
tolerance on 45 of 50 (also counted within noise: warm's highest confirmation reading at least cold's lowest);
the ratio with ``--no-cost-model`` higher than without. ``ratio_floor`` is the least
ratio the cold runs allow: a warm run spends at least one evaluation on each task. ``--compare`` runs the warm
phase both ways against the same cold runs; ``--keep DIR`` keeps every run's data dir to inspect, and
``--resume DIR/mk-reuse-…`` goes on with such a kept run: its finished cold runs are read back, the warm
phases run again.

    python benchmarks/memory_reuse.py --measure 41k_Gemm_Add_ReLU,44k_Matmul_Divide_GELU --warm 35k_Gemm_Scaling_Hardtanh_GELU --budget 8
    python benchmarks/memory_reuse.py --measure 27k_Matmul_Mish_Mish,24k_Matmul_Scale_ResidualAdd_Clamp_LogSumExp_Mish,47k_Matmul_Add_Swish_Tanh_GELU_Hardtanh --folds 3 --min-cold-evals 3 --compare
    python benchmarks/memory_reuse.py --budget 30                         # the full run: 50 tasks, 5 folds
    python benchmarks/memory_reuse.py --target tpu-v6e --measure 41k_Gemm_Add_ReLU,... --confirm 1   # modelled

On a ``tpu-*`` target the judge is the cost model: every reading is deterministic, so the ratio counts
evaluations, not the machine's load (on ``cpu`` one reading of a kernel can move by half its value).

``--variants`` measures memory that answers. The ``--measure`` tasks are the originals: each runs once with
an empty memory (``--budget`` evaluations), and their sessions together are the memory. Then each original's
metamorphic variants (``jaxbench.variants``, ``--variant-seed``) run twice with ``--variant-budget``
evaluations: **warm**, in a copy of the originals' memory, and **cold**, in an empty one. A variant is
*answered* when its run measures the original's confirmed speedup less ``--tolerance`` within the first two
evaluations besides the baseline (target: 90% of the variants whose original beat the reference, warm).
Variants that change the work (``dtype``, ``extra_op``, and the batch moves that change a shape's extents
only on paper) are reported in their own rows: their original's speedup is the bar, not a promise.

    python benchmarks/memory_reuse.py --variants --target tpu-v6e --measure 12p_RMSNorm,48k_Matmul_BatchNorm_BiasAdd_Divide_Swish --budget 20 --variant-budget 4 --confirm 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("JAX_PLATFORMS", "cpu")


class Step(BaseModel):
    """One evaluation of a session, in order."""

    n: int
    seconds: float
    passed: bool
    speedup: float | None = None
    sha: str = ""  # the measured kernel's source hash: the same kernel is recognised in another run


class Run(BaseModel):
    task: str
    data_dir: str = ""
    session_id: str
    evaluations: int
    seconds: float
    steps: list[Step]
    best_strategy: str = ""
    best_sha: str = ""
    is_reference: bool = True
    confirmed: float | None = None
    confirm_runs: list[float] = []
    engine_confirmed: float | None = None

    def reach_at(self, goal: float | None, miss: int, kernel: str = "") -> int:
        """The evaluation at which the run first measured ``goal`` or the kernel ``kernel`` (``miss`` when
        it never did)."""
        step = self.reach(goal, kernel) if goal else None
        return step.n if step else miss

    def first_correct(self) -> Step | None:
        return next((s for s in self.steps if s.passed), None)

    def reach(self, goal: float, kernel: str = "") -> Step | None:
        """The first correct step that read at least ``goal``, or that measured the kernel whose source hash
        is ``kernel`` (the cold run's winner): a run that measured the very kernel the cold run returned has
        reached the cold best, whatever that one reading said. One reading moves by a few percent on a quiet
        machine, more than the tolerance, so readings alone let a run miss the kernel it returned."""
        return next((s for s in self.steps if s.passed and ((s.speedup or 0.0) >= goal or (kernel and s.sha == kernel))),
                    None)


async def optimize(task: str, services: Any, budget: int, time_s: float, target: str) -> Any:
    """One session through the one engine's Auto API (the only place this benchmark starts one)."""
    from orchestrators.auto import AutoBudget, run_auto

    return await run_auto(task, services=services, target=target,
                          budget=AutoBudget(max_evaluations=budget, time_s=time_s))


def confirm(services: Any, task: str, result: Any, times: int) -> list[float]:
    """The speedups of ``times`` fresh measurements of the run's best kernel (the passing ones); its median
    is the run's figure and its spread the noise of that figure. The engine's own confirmation (the lower
    of two runs' lower ends) is kept beside it, not used: every run is judged the same way here."""
    if not result.best_source or times <= 0:
        return []
    from maxkernel.evaluation import evaluate_candidate

    loaded = services.task(task)
    if not result.target.startswith("cpu"):
        times = 1  # a modelled speedup is deterministic: one reading is the figure, with no spread
    got = [evaluate_candidate(loaded, result.best_source, result.target, "cpu", "confirm.py", services.evaluator)
           for _ in range(times)]
    return [round(float(r.speedup), 4) for r in got if r.passed and r.speedup is not None]


def spread(runs: list[float]) -> float | None:
    """(max - min) / median of a run's confirmation readings: how far one reading of it can move."""
    if len(runs) < 2:
        return None
    return round((max(runs) - min(runs)) / statistics.median(runs), 3)


def steps_of(store: Any, session_id: str) -> tuple[list[Step], float]:
    """The session's search evaluations from the event log (not the baseline or confirmation runs),
    with seconds since its first event."""
    from actors.policy import BASELINE, CONFIRM

    events = store.events(session_id=session_id)
    if not events:
        return [], 0.0
    start = events[0].created_at
    steps = []
    for e in events:
        if e.message_type not in ("EvalReport", "FixRequest"):
            continue
        if (e.payload.get("draft") or {}).get("produced_by") in (BASELINE, CONFIRM):
            continue  # the bar and the re-measurements are the engine's, not the search's steps
        report = e.payload["report"]
        steps.append(Step(n=len(steps) + 1, seconds=round((e.created_at - start).total_seconds(), 2),
                          passed=report["status"] == "ok" and bool(report["correct"]), speedup=report.get("speedup"),
                          sha=report.get("candidate_sha") or ""))
    return steps, round((events[-1].created_at - start).total_seconds(), 2)


def run_in(data_dir: Path, task: str, evaluator: Any, args: argparse.Namespace, label: str) -> Run:
    """One session in ``data_dir``, its best confirmed."""
    from actors.config import ActorConfig
    from actors.services import Services
    from jaxbench.candidate import source_sha

    services = Services(ActorConfig(remember=False, data_dir=str(data_dir)), evaluator=evaluator)
    try:
        result = asyncio.run(optimize(task, services, args.budget, args.time_s, args.target))
        steps, seconds = steps_of(services.store, result.session_id)
        report = result.best_report
        runs = confirm(services, task, result, args.confirm)
        confirmed = round(statistics.median(runs), 4) if runs else None
        # A best that does not beat the reference once confirmed is the reference returned.
        is_reference = (result.best_source is None or result.best_strategy == "reference" or confirmed is None
                        or confirmed <= 1.0 or (report is not None and report.label == "reference-equivalent"))
        run = Run(task=task, data_dir=str(data_dir), session_id=result.session_id, evaluations=result.evaluations, seconds=seconds,
                  steps=steps, best_strategy=result.best_strategy,
                  best_sha=source_sha(result.best_source) if result.best_source else "", is_reference=is_reference, confirmed=confirmed,
                  confirm_runs=runs, engine_confirmed=getattr(result, "confirmed_speedup", None))
    finally:
        asyncio.run(services.aclose())
    print(f"  {label} {task}: {run.best_strategy or '-'} confirmed {run.confirmed}x {runs}, "
          f"{run.evaluations} evaluations, {run.seconds} s", flush=True)
    return run


def fill(target_dir: Path, sources: list[Path]) -> None:
    """Memory of the cold runs in ``sources`` copied into ``target_dir``: kernels, notes and events."""
    from maxkernel.config import load_settings
    from memory import EventIn, Memory
    from memory.transfer import export_file, import_file

    with Memory.open(load_settings(data_dir=str(target_dir))) as into:
        for source in sources:
            with Memory.open(load_settings(data_dir=str(source))) as src:
                exported = source / "memory.jsonl"
                export_file(src, exported)
                events = [EventIn(message_type=e.message_type, payload=e.payload, session_id=e.session_id,
                                  correlation_id=e.correlation_id, task_id=e.task_id, candidate_id=e.candidate_id)
                          for e in src.store.events()]
            import_file(into, exported)
            into.store.append_events(events)


COLD_RUNS = "cold-runs.jsonl"  # each finished cold run, one line each: what --resume reads back
RUN_ARGS = ("budget", "time_s", "confirm", "target", "variants", "variant_budget", "variant_seed")  # what a resumed run must share with the cold runs it reuses


def cold_phase(tasks: list[str], root: Path, evaluator: Any, args: argparse.Namespace) -> dict[str, Run]:
    """Each task's cold run, in ``root/cold-<i>``; each is appended to ``root/cold-runs.jsonl`` when it ends,
    and a task already there (a resumed run) is read back, not run again."""
    path = root / COLD_RUNS
    done: dict[str, Run] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                run = Run.model_validate_json(line)
                done[run.task] = run
    cold: dict[str, Run] = {}
    for i, task in enumerate(tasks):
        if task in done:
            cold[task] = done[task]
            print(f"  cold {task}: read back from {done[task].data_dir}", flush=True)
            continue
        data_dir = root / f"cold-{i}"
        shutil.rmtree(data_dir, ignore_errors=True)  # a run cut off half-way starts again
        cold[task] = run_in(data_dir, task, evaluator, args, "cold")
        with path.open("a") as fh:
            fh.write(cold[task].model_dump_json() + "\n")
    return cold


def resume_root(args: argparse.Namespace) -> Path:
    """The folder of the run to resume (``--resume``), after checking it was run with the same settings; or a
    new one. Raises ``ValueError`` with the line to print."""
    settings = {k: str(getattr(args, k)) for k in RUN_ARGS}
    if args.resume is None:
        root = Path(tempfile.mkdtemp(prefix="mk-reuse-", dir=args.keep))
        (root / "run-args.json").write_text(json.dumps(settings))
        return root
    saved = args.resume / "run-args.json"
    if not saved.exists():
        raise ValueError(f"--resume: {args.resume} holds no run of this benchmark (no run-args.json)")
    before = json.loads(saved.read_text())
    differ = [f"--{k.replace('_', '-')} {before.get(k)} there, {v} here" for k, v in settings.items() if before.get(k) != v]
    if differ:
        raise ValueError(f"--resume: {args.resume} was run with other settings: {'; '.join(differ)}")
    return args.resume


def warm_phase(measured: list[str], extra: list[str], cold: dict[str, Run], root: Path, evaluator: Any,
               args: argparse.Namespace, tag: str) -> dict[str, Run]:
    """Every measured task once, each in a copy of the memory of the cold runs outside its fold."""
    warm: dict[str, Run] = {}
    for f, fold in enumerate(folds_of(measured, args.folds)):
        filled = root / f"{tag}-fold-{f}"
        shutil.rmtree(filled, ignore_errors=True)  # a resumed run's warm phases start again
        fill(filled, [Path(cold[t].data_dir) for t in measured + extra if t not in fold])
        print(f"{tag}: fold {f + 1}, memory from {len(measured) + len(extra) - len(fold)} other tasks", flush=True)
        for task in fold:
            here = root / f"{tag}-{measured.index(task)}"
            shutil.rmtree(here, ignore_errors=True)
            shutil.copytree(filled, here)
            warm[task] = run_in(here, task, evaluator, args, tag)
    return warm


def warm_up(evaluator: Any, task: str, target: str) -> None:
    """One untimed judge call first, so that the first cold run does not pay for starting the workers."""
    from jaxbench.task import load_task
    from maxkernel.evaluation import evaluate_candidate
    from maxkernel.rules.strategy import reference_source

    loaded = load_task(task)
    evaluate_candidate(loaded, reference_source(loaded), target, "cpu", "warm_up.py", evaluator)


def folds_of(tasks: list[str], n: int) -> list[list[str]]:
    n = max(1, min(n, len(tasks)))
    return [tasks[i::n] for i in range(n)]


def goal_of(cold: Run, tolerance: float) -> float | None:
    """What a run must measure (or the cold winner itself, ``Run.reach``) to count as reaching the cold
    run's confirmed best."""
    return cold.confirmed * (1 - tolerance) if cold.confirmed else None


def select_late(cold: dict[str, Run], measured: list[str], args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """The tasks whose cold search needed several evaluations (``--min-cold-evals``) to reach its confirmed
    best, and whose best is not the reference; chosen from the cold runs alone, before any warm run. A
    cold best found at the first evaluation leaves a ratio that cannot drop below 1. The rest only fill memory.
    With ``--min-cold-evals 1`` (the default) every task is measured warm, those whose cold run returned the
    reference too: the ratio leaves them out, the count of warm bests at least cold's does not."""
    if args.min_cold_evals <= 1:
        return list(measured), []
    keep: list[str] = []
    for task in measured:
        run = cold[task]
        if not run.is_reference and run.reach_at(goal_of(run, args.tolerance), args.budget + 1,
                                                 run.best_sha) >= args.min_cold_evals:
            keep.append(task)
    return keep, [t for t in measured if t not in keep]


def row(cold: Run, warm: Run, args: argparse.Namespace) -> dict[str, Any]:
    goal = goal_of(cold, args.tolerance)
    miss = args.budget + 1
    c_first, w_first = cold.first_correct(), warm.first_correct()
    c_reach = cold.reach(goal, cold.best_sha) if goal else None
    w_reach = warm.reach(goal, cold.best_sha) if goal else None
    return {"task": cold.task, "cold_first": c_first.n if c_first else None, "cold_first_s": c_first.seconds if c_first else None,
            "warm_first": w_first.n if w_first else None, "warm_first_s": w_first.seconds if w_first else None,
            "cold_reach": c_reach.n if c_reach else None, "cold_reach_s": c_reach.seconds if c_reach else None,
            "warm_reach": w_reach.n if w_reach else None, "warm_reach_s": w_reach.seconds if w_reach else None,
            "cold_best": cold.confirmed, "warm_best": warm.confirmed, "cold_strategy": cold.best_strategy,
            "warm_strategy": warm.best_strategy, "cold_is_reference": cold.is_reference,
            "cold_evals_counted": cold.reach_at(goal, miss, cold.best_sha),
            "warm_evals_counted": warm.reach_at(goal, miss, cold.best_sha),
            "cold_confirm_runs": cold.confirm_runs, "warm_confirm_runs": warm.confirm_runs,
            "cold_noise": spread(cold.confirm_runs), "warm_noise": spread(warm.confirm_runs),
            "cold_engine_confirmed": cold.engine_confirmed, "warm_engine_confirmed": warm.engine_confirmed,
            "warm_at_least_cold": at_least(warm, cold, args.tolerance),
            "warm_at_least_cold_within_noise": at_least(warm, cold, args.tolerance) or overlap(warm, cold)}


def at_least(warm: Run, cold: Run, tolerance: float) -> bool:
    """Warm's confirmed best is at least cold's, less the tolerance."""
    return bool(warm.confirmed is not None and (cold.confirmed is None or warm.confirmed >= cold.confirmed * (1 - tolerance)))


def overlap(warm: Run, cold: Run) -> bool:
    """Warm's confirmation readings reach into cold's: the two bests differ by less than one reading moves."""
    return bool(warm.confirm_runs and cold.confirm_runs and max(warm.confirm_runs) >= min(cold.confirm_runs))


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    counted = [r for r in rows if not r["cold_is_reference"] and r["cold_best"]]
    cold_total = sum(r["cold_evals_counted"] for r in counted)
    warm_total = sum(r["warm_evals_counted"] for r in counted)
    noise = [n for r in rows for n in (r["cold_noise"], r["warm_noise"]) if n is not None]
    # No warm run reaches anything before its first evaluation: the least ratio these cold runs allow.
    floor = round(len(counted) / cold_total, 3) if cold_total else None
    return {"ratio": round(warm_total / cold_total, 3) if cold_total else None, "ratio_floor": floor,
            "tasks_counted": len(counted),
            "cold_total": cold_total, "warm_total": warm_total,
            "noise_median": round(statistics.median(noise), 3) if noise else None,
            "noise_max": max(noise) if noise else None,
            "warm_at_least_cold": f"{sum(r['warm_at_least_cold'] for r in rows)}/{len(rows)}",
            "warm_at_least_cold_within_noise": f"{sum(r['warm_at_least_cold_within_noise'] for r in rows)}/{len(rows)}"}


def print_table(rows: list[dict[str, Any]], args: argparse.Namespace, title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    def pair(n: Any, s: Any) -> str:
        return "-" if n is None else f"{n} / {s}s"

    table = Table(title=f"memory reuse · {args.budget} evaluations per task · confirmed speedups{title}")
    for col in ("task", "cold first ok", "warm first ok", "cold to cold best", "warm to cold best", "cold best",
                "warm best"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["task"], pair(r["cold_first"], r["cold_first_s"]), pair(r["warm_first"], r["warm_first_s"]),
                      pair(r["cold_reach"], r["cold_reach_s"]), pair(r["warm_reach"], r["warm_reach_s"]),
                      f"{r['cold_best']}x ±{r['cold_noise']} {r['cold_strategy']}"
                      + (" (reference)" if r["cold_is_reference"] else ""),
                      f"{r['warm_best']}x ±{r['warm_noise']} {r['warm_strategy']}")
    Console(width=200).print(table)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--measure", default="", help="comma-separated task ids or folders (default: the whole suite)")
    parser.add_argument("--warm", default="", help="comma-separated task ids or folders that only fill memory")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--budget", type=int, default=30, help="evaluations per session")
    parser.add_argument("--time-s", type=float, default=900.0, help="time limit of one session")
    parser.add_argument("--confirm", type=int, default=3, help="measurements of each run's best kernel")
    parser.add_argument("--tolerance", type=float, default=None,
                        help="how close to the cold best counts as reached (default 0.05; with --variants, how close "
                             "to the original's speedup: default 0.10)")
    parser.add_argument("--min-cold-evals", type=int, default=1,
                        help="measure warm only the tasks whose cold run first reached its confirmed best at this "
                             "evaluation or later (and did not return the reference); the others only fill memory")
    parser.add_argument("--no-cost-model", action="store_true", help="warm runs order trials by hand, not by the learned model")
    parser.add_argument("--compare", action="store_true",
                        help="run the warm phase twice, with and without the learned cost model, against the same cold runs")
    parser.add_argument("--target", default="cpu",
                        help="cpu (measured: a reading moves with the machine's load) or a TPU such as tpu-v6e "
                             "(the cost model: deterministic, so one confirmation reading is the figure)")
    parser.add_argument("--variants", action="store_true",
                        help="memory that answers: the --measure tasks are originals, their variants run warm and cold")
    parser.add_argument("--variant-budget", type=int, default=20, help="with --variants: evaluations per variant session")
    parser.add_argument("--variant-seed", type=int, default=397496316,
                        help="with --variants: the seed that draws each original's two variant kinds")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.add_argument("--keep", type=Path, default=None, help="keep every run's data dir under this folder")
    parser.add_argument("--resume", type=Path, default=None,
                        help="a kept run's folder (under --keep): its finished cold runs are read back, the rest run")
    args = parser.parse_args()

    from actors.config import ActorConfig
    from actors.services import Services
    from jaxbench.task import TaskError, list_tasks, load_task
    from maxkernel.logging import configure
    from maxkernel.tuning.learned import ENV_SWITCH

    configure("warning")
    if args.tolerance is None:
        args.tolerance = 0.10 if args.variants else 0.05
    for key, value in {"MAXKERNEL_EVAL_TIMING_ROUNDS": "3", "MAXKERNEL_EVAL_CORRECTNESS_SEEDS": "1"}.items():
        os.environ.setdefault(key, value)
    if args.compare and args.no_cost_model:
        print("error: --compare already runs the warm phase without the cost model; drop --no-cost-model", file=sys.stderr)
        return 2
    measured = [t for t in args.measure.split(",") if t] or [t.id for t in list_tasks()]
    extra = [t for t in args.warm.split(",") if t and t not in measured]
    from maxkernel.targets.names import TargetError, parse_target

    try:
        parse_target(args.target)
    except TargetError as exc:
        print(f"error: --target: {exc}", file=sys.stderr)
        return 2
    for task in measured + extra:
        try:
            load_task(task)
        except TaskError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
    try:
        root = resume_root(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    judge = Services(ActorConfig(data_dir=str(root / "judge")))
    started = time.monotonic()
    try:
        evaluator = judge.evaluator
        warm_up(evaluator, measured[0], args.target)
        if args.variants:
            return run_variants(measured, root, evaluator, args)
        print(f"cold: {len(measured) + len(extra)} tasks, each with an empty memory", flush=True)
        cold = cold_phase(measured + extra, root, evaluator, args)
        measured, dropped = select_late(cold, measured, args)
        extra += dropped
        if args.json:  # written now, so that a run cut off (or with no task to measure warm) leaves the cold figures
            args.json.write_text(json.dumps(cold_report(cold, measured, args), indent=2))
        chosen = ("tasks, every one" if args.min_cold_evals <= 1 else
                  f"tasks whose cold best is not the reference and came at evaluation {args.min_cold_evals} or later")
        print(f"measured warm: {len(measured)} {chosen} ({', '.join(measured) or 'none'}); "
              f"memory only: {', '.join(dropped) or 'none'}", flush=True)
        if not measured:
            print("error: no measured task needed that many cold evaluations; lower --min-cold-evals", file=sys.stderr)
            return 1
        variants = [("warm", not args.no_cost_model)] + ([("warm-hand", False)] if args.compare else [])
        warm: dict[str, dict[str, Run]] = {}
        for tag, model_on in variants:
            os.environ[ENV_SWITCH] = "on" if model_on else "off"
            warm[tag] = warm_phase(measured, extra, cold, root, evaluator, args, tag)
    finally:
        asyncio.run(judge.aclose())
        if args.keep is None and args.resume is None:
            shutil.rmtree(root, ignore_errors=True)
    sections: dict[str, dict[str, Any]] = {}
    for tag, model_on in variants:
        rows = [row(cold[t], warm[tag][t], args) for t in measured]
        print_table(rows, args, "" if model_on else " · warm without the learned cost model")
        summary = summarize(rows)
        print(f"{tag}: ratio (warm / cold evaluations to the cold confirmed best, {summary['tasks_counted']} tasks "
              f"whose cold best is not the reference): {summary['ratio']} (target <= 0.33; the least these cold runs allow, one "
              f"evaluation a task: {summary['ratio_floor']}); warm best >= cold best "
              f"within {args.tolerance:.0%}: {summary['warm_at_least_cold']} (or within the readings' spread: "
              f"{summary['warm_at_least_cold_within_noise']}); confirmation spread (max - min over "
              f"median of {args.confirm} runs): median {summary['noise_median']}, max {summary['noise_max']}")
        sections["learned" if model_on else "no_cost_model"] = {"rows": rows, **summary}
    report: dict[str, Any] = dict(sections["no_cost_model" if args.no_cost_model else "learned"])
    if args.compare:
        report["no_cost_model"] = sections["no_cost_model"]
    report.update(cold_report(cold, measured, args))
    print(f"{time.monotonic() - started:.0f} s in all")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


ANSWERED_WITHIN = 2  # evaluations besides the baseline in which a variant counts as answered from memory
VARIANT_RUNS = "variant-runs.jsonl"  # each finished variant run (warm or cold), one line each: what --resume reads back


class VariantRun(BaseModel):
    """One run of a variant, with the original it was derived from."""

    variant: str
    kind: str
    original: str
    memory: str  # "warm" (the originals' sessions in memory) or "cold" (an empty memory)
    run: Run


def variant_phase(originals: dict[str, Run], root: Path, evaluator: Any, args: argparse.Namespace) -> list[VariantRun]:
    """Each original's variants, warm (a copy of every original's session) and cold (an empty memory); a run
    already in ``root/variant-runs.jsonl`` is read back."""
    from jaxbench.task import load_task
    from jaxbench.variants import derive_for_benchmark

    path = root / VARIANT_RUNS
    done = {}
    if path.exists():
        done = {(v.variant, v.memory): v for v in
                (VariantRun.model_validate_json(line) for line in path.read_text().splitlines() if line.strip())}
    filled = root / "originals-memory"
    holds = filled / "originals.json"  # which originals' sessions it holds: a resume with more refills it
    if not holds.exists() or json.loads(holds.read_text()) != sorted(originals):
        shutil.rmtree(filled, ignore_errors=True)
        fill(filled, [Path(r.data_dir) for r in originals.values()])
        holds.write_text(json.dumps(sorted(originals)))
    session = argparse.Namespace(**{**vars(args), "budget": args.variant_budget})  # a variant's own budget
    runs: list[VariantRun] = []
    for task in originals:
        for kind, folder in derive_for_benchmark(load_task(task), root / "variants", args.variant_seed):
            for memory in ("warm", "cold"):
                key = (folder.name, memory)
                if key in done:
                    runs.append(done[key])
                    continue
                here = root / f"variant-{memory}-{folder.name}"
                shutil.rmtree(here, ignore_errors=True)
                if memory == "warm":
                    shutil.copytree(filled, here)
                got = VariantRun(variant=folder.name, kind=kind, original=task, memory=memory,
                                 run=run_in(here, str(folder), evaluator, session, memory))
                with path.open("a") as fh:
                    fh.write(got.model_dump_json() + "\n")
                runs.append(got)
    return runs


def variant_rows(originals: dict[str, Run], runs: list[VariantRun], tolerance: float) -> list[dict[str, Any]]:
    """Per variant: the evaluation (besides the baseline) at which each run first measured its original's
    confirmed speedup less ``tolerance``, whether that is within ``ANSWERED_WITHIN``, and each run's best."""
    from jaxbench.variants import KEEP

    by: dict[str, dict[str, VariantRun]] = {}
    for v in runs:
        by.setdefault(v.variant, {})[v.memory] = v
    rows = []
    for name, pair in by.items():
        if set(pair) != {"warm", "cold"}:
            continue
        warm, cold = pair["warm"], pair["cold"]
        original = originals[warm.original]
        goal = original.confirmed * (1 - tolerance) if original.confirmed and not original.is_reference else None
        reach = {m: (r.run.reach(goal) if goal else None) for m, r in pair.items()}
        rows.append({"variant": name, "kind": warm.kind, "keeps_work": warm.kind in KEEP, "original": warm.original,
                     "original_best": original.confirmed, "original_strategy": original.best_strategy,
                     "original_is_reference": original.is_reference,
                     **{f"{m}_reach": reach[m].n if reach[m] else None for m in ("warm", "cold")},
                     **{f"{m}_answered": bool(reach[m] and reach[m].n <= ANSWERED_WITHIN) for m in ("warm", "cold")},
                     **{f"{m}_best": pair[m].run.confirmed for m in ("warm", "cold")},
                     **{f"{m}_strategy": pair[m].run.best_strategy for m in ("warm", "cold")},
                     **{f"{m}_evaluations": pair[m].run.evaluations for m in ("warm", "cold")}})
    return rows


def variant_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Answered shares over the variants whose original beat the reference, all and those keeping the work."""
    counted = [r for r in rows if not r["original_is_reference"] and r["original_best"]]
    keeping = [r for r in counted if r["keeps_work"]]

    def share(rs: list[dict[str, Any]], memory: str) -> str:
        return f"{sum(r[f'{memory}_answered'] for r in rs)}/{len(rs)}"

    return {"variants": len(rows), "counted": len(counted), "keeping_work": len(keeping),
            "warm_answered": share(counted, "warm"), "cold_answered": share(counted, "cold"),
            "warm_answered_keeping_work": share(keeping, "warm"), "cold_answered_keeping_work": share(keeping, "cold")}


def print_variant_table(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"memory that answers · originals {args.budget} evaluations, variants {args.variant_budget} · "
                        f"answered: the original's speedup less {args.tolerance:.0%} within {ANSWERED_WITHIN} evaluations")
    for col in ("variant", "original best", "warm reach", "cold reach", "warm best", "cold best"):
        table.add_column(col)
    for r in rows:
        mark = {True: " ✓", False: ""}
        table.add_row(r["variant"], f"{r['original_best']}x {r['original_strategy']}"
                      + (" (reference)" if r["original_is_reference"] else ""),
                      f"{r['warm_reach'] or '-'}{mark[r['warm_answered']]}", f"{r['cold_reach'] or '-'}{mark[r['cold_answered']]}",
                      f"{r['warm_best']}x {r['warm_strategy']}", f"{r['cold_best']}x {r['cold_strategy']}")
    Console(width=200).print(table)


def run_variants(measured: list[str], root: Path, evaluator: Any, args: argparse.Namespace) -> int:
    """The ``--variants`` mode: originals cold, then their variants warm and cold; the table and the shares."""
    print(f"originals: {len(measured)} tasks, each with an empty memory, {args.budget} evaluations", flush=True)
    originals = cold_phase(measured, root, evaluator, args)
    runs = variant_phase(originals, root, evaluator, args)
    rows = variant_rows(originals, runs, args.tolerance)
    print_variant_table(rows, args)
    summary = variant_summary(rows)
    print(f"answered within {ANSWERED_WITHIN} evaluations besides the baseline, of {summary['counted']} variants whose "
          f"original beat the reference: warm {summary['warm_answered']}, cold {summary['cold_answered']} "
          f"(target: warm 90%); keeping the work: warm {summary['warm_answered_keeping_work']}, "
          f"cold {summary['cold_answered_keeping_work']}")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, **summary, **cold_report(originals, measured, args)}, indent=2))
    return 0


def cold_report(cold: dict[str, Run], measured: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """The cold runs' figures (each task's confirmed best and the evaluation that reached it) and the options."""
    return {"cold": {t: {"best": r.confirmed, "confirm_runs": r.confirm_runs, "noise": spread(r.confirm_runs),
                         "strategy": r.best_strategy, "is_reference": r.is_reference, "measured_warm": t in measured,
                         "reach": r.reach_at(goal_of(r, args.tolerance), args.budget + 1, r.best_sha), "evaluations": r.evaluations}
                     for t, r in cold.items()},
            "args": {k: str(v) for k, v in vars(args).items()}}


if __name__ == "__main__":
    sys.exit(main())
