"""How far the harness alone moves a speedup: the reference judged as a candidate, K times per task (a
benchmark, not a test).

    python benchmarks/timing_bias.py [--tasks 8p 11p ...] [--runs 5] [--harness alike,legacy] [--json FILE]

A fair harness reads the reference against itself at 1.00x with a narrow interval; the upper end of that
interval is the bar every candidate of the task must clear (``actors.policy.baseline_bar``). Each task is
judged through one ``Evaluator`` per harness, as in a session: the same warm candidate worker for every
task, the reference worker reloaded when the task changes. ``--harness both`` runs the two harnesses task by
task in turn in one run, so their figures share the machine's load. Harnesses: ``alike`` (the default: the
workers' allocator fixed alike, several calls per round), ``legacy`` (the judge's allocator environment, one
call per round), ``pinned`` (``alike`` with both workers pinned to one core).

Per task and harness: the K readings, their spread ((max - min) / median), the median interval width
(high - low) and the median upper end (the bar a session would set from one reading).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DEFAULT_TASKS = ("8p", "11p", "12p", "15p", "19k", "27k", "31k", "32k", "41k", "1p", "14p", "21k")
HARNESSES = ("alike", "legacy", "pinned")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="*", default=list(DEFAULT_TASKS),
                        help="suite ids, id prefixes (8p) or task folders")
    parser.add_argument("--runs", type=int, default=5, help="judgements of the reference per task and harness")
    parser.add_argument("--harness", default="alike,legacy", help=f"comma-separated, of {', '.join(HARNESSES)}")
    parser.add_argument("--json", type=Path, help="write the rows as JSON")
    args = parser.parse_args(argv)
    if args.runs < 1:
        print(f"error: --runs {args.runs}: at least 1", file=sys.stderr)
        return 2
    os.environ.setdefault("MAXKERNEL_DATA_DIR", tempfile.mkdtemp(prefix="timing_bias_"))
    from jaxbench.evaluate import EvalConfig, Evaluator
    from jaxbench.pool import WorkerPool
    from jaxbench.task import TaskError, load_task
    from maxkernel.rules.strategy import reference_source

    try:
        tasks = [load_task(name) for name in args.tasks]
    except TaskError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    harnesses = tuple(h.strip() for h in args.harness.split(",") if h.strip())
    unknown = [h for h in harnesses if h not in HARNESSES]
    if unknown or not harnesses:
        print(f"error: --harness {args.harness!r}: expected some of {', '.join(HARNESSES)}", file=sys.stderr)
        return 2
    evaluators = {h: _evaluator(h, Evaluator, EvalConfig, WorkerPool) for h in harnesses}
    rows: list[dict[str, Any]] = []
    try:
        for task in tasks:
            source = reference_source(task)
            for harness in harnesses:
                reports = [evaluators[harness].evaluate(task, source, filename="reference_as_candidate.py")
                           for _ in range(args.runs)]
                rows.append(_row(task.id, harness, reports))
                _print_row(rows[-1])
                if args.json:
                    args.json.write_text(json.dumps(rows, indent=2))
    finally:
        for evaluator in evaluators.values():
            evaluator.close()
    _summary(rows, harnesses)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


def _evaluator(harness: str, Evaluator: Any, EvalConfig: Any, WorkerPool: Any) -> Any:
    from jaxbench.pool import one_core

    cpus = one_core() if harness == "pinned" else None
    pool = WorkerPool(1, alike=harness != "legacy", cpus=cpus)
    return Evaluator(pool=pool, config=EvalConfig(harness="legacy" if harness == "legacy" else "alike"))


def _row(task_id: str, harness: str, reports: list[Any]) -> dict[str, Any]:
    passed = [r for r in reports if r.passed and r.speedup]
    readings = [float(r.speedup) for r in passed]
    widths = [r.speedup_ci[1] - r.speedup_ci[0] for r in passed if r.speedup_ci]
    highs = [r.speedup_ci[1] for r in passed if r.speedup_ci]
    mid = statistics.median(readings) if readings else 0.0
    return {
        "task": task_id, "harness": harness, "readings": [round(x, 3) for x in readings],
        "failed": [f"{r.status}: {r.reason}"[:160] for r in reports if not (r.passed and r.speedup)],
        "median": round(mid, 3), "spread": round((max(readings) - min(readings)) / mid, 3) if mid else None,
        "width": round(statistics.median(widths), 3) if widths else None,
        "bar": round(max(1.0, statistics.median(highs)), 3) if highs else None,
        "ref_ms": [r.ref_ms for r in passed], "kernel_ms": [r.kernel_ms for r in passed],
    }


def _print_row(row: dict[str, Any]) -> None:
    shown = " ".join(f"{x:.2f}" for x in row["readings"])
    failed = f"  failed: {'; '.join(row['failed'])}" if row["failed"] else ""
    ms = statistics.median(row["ref_ms"]) if row["ref_ms"] else 0.0
    print(f"{row['task']:<44} {row['harness']:<7} ref {ms:7.2f} ms  readings {shown}  median {row['median']:.3f}  "
          f"spread {row['spread']}  width {row['width']}  bar {row['bar']}{failed}", flush=True)


def _summary(rows: list[dict[str, Any]], harnesses: tuple[str, ...]) -> None:
    print()
    print("| harness | tasks | median |reading - 1| | median spread | median interval width | median bar |")
    print("|---|---|---|---|---|---|")
    for harness in harnesses:
        mine = [r for r in rows if r["harness"] == harness and r["readings"]]
        if not mine:
            continue
        off = statistics.median(abs(x - 1.0) for r in mine for x in r["readings"])
        print(f"| {harness} | {len(mine)} | {off:.3f} | {statistics.median(r['spread'] for r in mine):.3f} | "
              f"{statistics.median(r['width'] for r in mine if r['width'] is not None):.3f} | "
              f"{statistics.median(r['bar'] for r in mine if r['bar'] is not None):.3f} |")


if __name__ == "__main__":
    raise SystemExit(main())
