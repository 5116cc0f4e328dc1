"""Whether a claimed speedup interval holds: each kernel judged again in fresh workers (a benchmark, not a
test; run it on an otherwise idle machine).

    python benchmarks/interval_coverage.py [--tasks 1p 21k ...] [--repeats 5] [--json FILE] [--resume FILE]

For every task, one kernel (the first strategy the rules propose for the ``cpu`` target whose source renders
and is judged correct) is evaluated ``repeats + 1`` times, each time by a new ``Evaluator`` over a new worker
pool, so no worker, heap or compiled executable is shared between two readings. Reading ``i`` checks the
interval claimed by reading ``i - 1``: covered when its point estimate lies inside that interval. The default
is 20 tasks x 5 repeats = 100 checks. Printed: per task the readings, intervals and covered count; then the
coverage over all checks and the median half-width of the claimed intervals relative to their points, against
the targets (at least 90 in 100 covered; median half-width at most 25%).

``--json`` rewrites the rows after every task; ``--resume FILE`` skips the tasks FILE already holds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# The tasks whose cpu winners were not the reference in the whole-suite cpu run (docs/results/suite-cpu.md),
# less the three slowest to judge: kernels with real speedups, from 1.05x to about 30x.
DEFAULT_TASKS = ("1p", "2p", "4p", "5p", "7p", "8p", "9p", "11p", "14p", "15p", "21k", "23k", "25k", "27k", "28k",
                 "33k", "34k", "39k", "46k", "49k")
COVERAGE_TARGET = 0.90
HALF_WIDTH_CAP = 0.25


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="*", default=list(DEFAULT_TASKS),
                        help="suite ids, id prefixes (8p) or task folders")
    parser.add_argument("--repeats", type=int, default=5, help="re-evaluations per task (each checks the one before)")
    parser.add_argument("--json", type=Path, help="write the rows as JSON (rewritten after every task)")
    parser.add_argument("--resume", type=Path, metavar="FILE", help="keep FILE's rows and run the tasks it lacks")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        print(f"error: --repeats {args.repeats}: at least 1", file=sys.stderr)
        return 2
    rows: list[dict[str, Any]] = []
    if args.resume:
        try:
            rows = json.loads(args.resume.read_text())
        except (OSError, ValueError) as exc:
            print(f"error: --resume {args.resume}: {exc}", file=sys.stderr)
            return 2
        args.json = args.json or args.resume
    os.environ.setdefault("MAXKERNEL_DATA_DIR", tempfile.mkdtemp(prefix="interval_coverage_"))
    from jaxbench.task import TaskError, load_task

    try:
        tasks = [load_task(name) for name in args.tasks]
    except TaskError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    done = {row["task"] for row in rows}
    for task in tasks:
        if task.id in done:
            continue
        started = time.monotonic()
        rows.append(_task_row(task, args.repeats))
        rows[-1]["s"] = round(time.monotonic() - started)
        _print_row(rows[-1])
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))
    return _summary(rows)


def _fresh_evaluation(task: Any, source: str) -> Any:
    """One judgement by a new evaluator over a new pool: nothing carried over from an earlier reading."""
    from jaxbench.evaluate import EvalConfig, Evaluator
    from jaxbench.pool import WorkerPool
    from maxkernel.evaluation import evaluate_candidate

    with Evaluator(pool=WorkerPool(1), config=EvalConfig()) as evaluator:
        return evaluate_candidate(task, source, target="cpu", evaluator=evaluator)


def _kernel(task: Any) -> tuple[str, str, Any]:
    """The first proposed strategy (not the reference) that renders and is judged correct, with that report."""
    from maxkernel.analysis import analyze_task
    from maxkernel.rules.strategy import propose_strategies, render

    tried: list[str] = []
    for strategy in propose_strategies(task, analyze_task(task, "cpu"), "cpu"):
        if strategy.kind == "reference":
            continue
        try:
            source = render(task, strategy)
        except Exception as exc:  # a strategy that does not render here is skipped, and said
            tried.append(f"{strategy.name}: {type(exc).__name__}")
            continue
        report = _fresh_evaluation(task, source)
        if report.passed and report.speedup_ci:
            return strategy.name, source, report
        tried.append(f"{strategy.name}: {report.status}")
    raise LookupError("; ".join(tried) or "no strategy proposed")


def _task_row(task: Any, repeats: int) -> dict[str, Any]:
    row: dict[str, Any] = {"task": task.id}
    try:
        row["strategy"], source, first = _kernel(task)
    except LookupError as exc:
        return {**row, "error": f"no correct kernel: {exc}"[:300], "readings": []}
    reports = [first] + [_fresh_evaluation(task, source) for _ in range(repeats)]
    readings = [{"speedup": r.speedup, "interval": list(r.speedup_ci) if r.speedup_ci else None,
                 "status": r.status} for r in reports]
    checks = []
    for claim, again in zip(readings, readings[1:]):
        if claim["interval"] is None or again["status"] != "ok" or not again["speedup"]:
            continue
        low, high = claim["interval"]
        checks.append({"covered": low <= again["speedup"] <= high,
                       "half_width": (high - low) / 2 / claim["speedup"]})
    return {**row, "readings": readings, "checks": checks}


def _print_row(row: dict[str, Any]) -> None:
    if row.get("error"):
        print(f"{row['task']:<40} {row['error']}", flush=True)
        return
    shown = "  ".join(f"{r['speedup']:.2f} ({r['interval'][0]:.2f}-{r['interval'][1]:.2f})" if r["interval"]
                      else f"{r['status']}" for r in row["readings"])
    covered = sum(c["covered"] for c in row["checks"])
    print(f"{row['task']:<40} {row['strategy']:<28} {covered}/{len(row['checks'])} covered  {shown}  ({row['s']} s)",
          flush=True)


def _summary(rows: list[dict[str, Any]]) -> int:
    checks = [c for row in rows for c in row.get("checks", [])]
    if not checks:
        print("no checks ran")
        return 1
    covered = sum(c["covered"] for c in checks)
    half = statistics.median(c["half_width"] for c in checks)
    errors = [row["task"] for row in rows if row.get("error")]
    met = covered >= COVERAGE_TARGET * len(checks) and half <= HALF_WIDTH_CAP
    print()
    print("| checks | covered | median half-width of the claimed interval | tasks without a kernel |")
    print("|---|---|---|---|")
    print(f"| {len(checks)} | {covered} ({covered / len(checks):.0%}) | ±{half:.1%} | {len(errors)} |")
    print(f"targets: covered >= {COVERAGE_TARGET:.0%}, median half-width <= {HALF_WIDTH_CAP:.0%}: "
          f"{'met' if met else 'not met'}")
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
