"""Speedups of the one engine (``maxkernel optimize``: an Auto session on the actors) over the suite at
``cpu`` size (a benchmark, not a test).

    python benchmarks/suite_speedup.py [--tasks 12p_RMSNorm 21k_...] [--budget 120] [--json FILE]

Per task: reference ms, best ms, the confirmed speedup, what produced it (rewrite, or template with
parameters), and "ref as cand.": the judge's speedup of the reference itself evaluated as a candidate
(how much the judge-process vs worker-process timing alone moves the ratio; a winner must beat max(1,
that)), and "unseen": whether the returned kernel passed the evaluator's check at an unseen size drawn
from the task's free sizes (with the size). At the end: tasks with a correct candidate that is not the reference itself, fast_1.1 / fast_1.5
(share of tasks correct and at least 1.1x / 1.5x faster), and the geometric-mean speedup (a task without
a confirmed faster candidate counts 1.0x), and how many returned non-reference kernels passed the unseen size. ``--compare-old`` runs the separate rules loop on the same
tasks in the same run (alternating which goes first) and prints both tables. Every run uses one
evaluator and a fresh data dir, so no task recalls a kernel from an earlier run of the benchmark.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="*", help="suite ids or task folders (default: the whole suite)")
    parser.add_argument("--budget", type=float, default=120.0, help="seconds per task")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="write the rows as JSON")
    args = parser.parse_args(argv)

    os.environ["MAXKERNEL_DATA_DIR"] = tempfile.mkdtemp(prefix="suite_speedup_")
    from actors.config import ActorConfig
    from actors.services import Services
    from jaxbench.evaluate import Evaluator
    from jaxbench.task import list_tasks, load_task
    from maxkernel.logging import configure

    configure("warning")
    tasks = [load_task(t) for t in args.tasks] if args.tasks else list_tasks()
    console = Console(width=170)
    rows: list[dict[str, Any]] = []
    with Evaluator() as evaluator:
        services = Services(ActorConfig(remember=False), evaluator=evaluator)
        try:
            run = _engine(services, args)
            for task in tasks:
                rows.append(_timed(run, task, console))
                if args.json:
                    args.json.write_text(json.dumps(rows, indent=2))
        finally:
            asyncio.run(services.aclose())
    _print(console, rows, args.budget)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


def _timed(run: Callable[[Any], dict[str, Any]], task: Any, console: Console) -> dict[str, Any]:
    started = time.monotonic()
    try:
        row = run(task)
    except Exception as exc:  # one broken task must not end the benchmark: it is a row with a reason
        row = {"task": task.id, "error": f"{type(exc).__name__}: {exc}"[:200], "speedup": 1.0, "correct_nonref": False}
    row["seconds"] = round(time.monotonic() - started, 1)
    said = f"error {row['error']}" if "error" in row else f"{row['produced_by']} {row['speedup']:.2f}x"
    console.print(f"{task.id}: {said} ({row['seconds']:.0f}s)", markup=False)
    return row


def _engine(services: Any, args: argparse.Namespace) -> Callable[[Any], dict[str, Any]]:
    from orchestrators.auto import AutoBudget, run_auto

    def run(task: Any) -> dict[str, Any]:
        budget = AutoBudget(time_s=args.budget, max_evaluations=None, seed=args.seed)
        result = asyncio.run(run_auto(str(task.path), services=services, budget=budget, mode="optimize"))
        report = result.best_report
        tried = [t for t in result.trials if t.role in ("draft", "fix", "tune") and t.status == "ok"
                 and t.label != "reference-equivalent" and t.speedup]
        best = max(tried, key=lambda t: t.speedup or 0.0, default=None)
        unseen = report.check("correct_unseen_size") if report else None
        params = {k: v for k, v in result.best_params.items() if k not in ("rewrites", "source")}
        return {"task": result.task_id, "ref_ms": report.ref_ms if report else None,
                "best_ms": report.kernel_ms if report else None,
                "speedup": float(result.confirmed_speedup) if result.beat_reference and result.confirmed_speedup else 1.0,
                "produced_by": result.best_strategy + (f" {params}" if params else ""),
                "label": report.label if report else None, "beat_reference": result.beat_reference,
                "correct_nonref": bool(tried), "best_nonref": best.speedup if best else None,
                "best_nonref_by": best.strategy if best else None,
                "correct_nonref_by": sorted({t.strategy for t in tried}), "baseline": result.baseline_speedup,
                "trials": result.evaluations, "session_id": result.session_id,
                "unseen_passed": unseen.passed if unseen else None, "unseen_size": unseen.detail if unseen else ""}

    return run


def _print(console: Console, rows: list[dict[str, Any]], budget: float) -> None:
    table = Table(title=f"maxkernel optimize (one engine), cpu size, {budget:g} s per task")
    for col in ("task", "ref ms", "best ms", "speedup", "produced by", "best non-ref", "ref as cand.", "unseen", "s"):
        table.add_column(col, justify="left" if col in ("task", "produced by") else "right")
    for r in rows:
        if "error" in r:
            table.add_row(str(r["task"]), "-", "-", "1.00x", f"error: {r['error']}", "-", "-", "-", str(r["seconds"]))
            continue
        table.add_row(str(r["task"]), _ms(r["ref_ms"]), _ms(r["best_ms"]), f"{r['speedup']:.2f}x", str(r["produced_by"]),
                      f"{r['best_nonref']:.2f}x" if r["best_nonref"] else "-",
                      f"{r['baseline']:.2f}x" if r.get("baseline") else "-", _unseen(r), str(r["seconds"]))
    console.print(table)
    n = len(rows)
    nonref = sum(1 for r in rows if r.get("correct_nonref"))
    fast11 = sum(1 for r in rows if float(r["speedup"]) >= 1.1)  # type: ignore[arg-type]
    fast15 = sum(1 for r in rows if float(r["speedup"]) >= 1.5)  # type: ignore[arg-type]
    geo = math.exp(sum(math.log(max(float(r["speedup"]), 1e-9)) for r in rows) / n) if n else 1.0  # type: ignore[arg-type]
    console.print(f"tasks: {n}   correct non-reference candidate: {nonref}/{n}   "
                  f"fast_1.1: {fast11}/{n} ({fast11 / max(n, 1):.0%})   fast_1.5: {fast15}/{n} ({fast15 / max(n, 1):.0%})   "
                  f"geomean speedup: {geo:.2f}x", markup=False)
    returned = [r for r in rows if r.get("beat_reference")]
    unseen_ok = sum(1 for r in returned if r.get("unseen_passed"))
    console.print(f"returned non-reference kernels passing the unseen size: {unseen_ok}/{len(returned)}   "
                  f"unchecked (task declares no free size): {sum(1 for r in returned if r.get('unseen_passed') is None)}",
                  markup=False)


def _unseen(row: dict[str, Any]) -> str:
    if row.get("unseen_passed") is None:
        return "-"
    size = str(row.get("unseen_size", "")).removeprefix("unseen size ").split(":")[0]
    return f"{'pass' if row['unseen_passed'] else 'FAIL'} {size}"


def _ms(value: object) -> str:
    return "-" if value is None else f"{float(value):.2f}"  # type: ignore[arg-type]


if __name__ == "__main__":
    sys.exit(main())
