"""Memory reuse: does a search that starts from memory reach a good kernel sooner?

On ``--tasks`` suite tasks, the rules-brain search runs twice with the same budget: **cold** (empty memory)
and **warm** (memory filled first by the same search on ``--warm-tasks`` *other* tasks). For each task it
prints time (evaluations and seconds) to the first correct kernel, the best speedup, and how many
evaluations each run needed to come within ``--tolerance`` of the cold run's final best. The target: warm
needs under half the evaluations of cold on average. Cold and warm run side by side in one process, each
in its own fresh data dir.

    python benchmarks/memory_reuse.py --tasks 3 --warm-tasks 6 --budget 6      # small
    python benchmarks/memory_reuse.py                                          # 10 tasks, warm on the other 40
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("JAX_PLATFORMS", "cpu")


def split(n_eval: int, n_warm: int, chosen: list[str] | None = None,
          warm: list[str] | None = None) -> tuple[list[str], list[str]]:
    """Every fifth suite task is measured (or the ``--measure`` ones); the warm memory comes from the others."""
    from jaxbench.task import list_tasks

    ids = [t.id for t in list_tasks()]
    measured = (chosen or ids[::5])[:n_eval]
    others = [t for t in (warm or ids) if t not in measured][:n_warm]
    return measured, others


def evals_to_reach(nodes: list[Any], target: float | None) -> int | None:
    if target is None:
        return None
    for i, node in enumerate(sorted(nodes, key=lambda n: n.seq), 1):
        if node.passed and (node.speedup or 0.0) >= target:
            return i
    return None


async def run_phase(tasks: list[str], config: Any, data_dir: Path, label: str) -> dict[str, dict[str, Any]]:
    """One search per task in ``data_dir``; what each one reached and when."""
    from actors.config import ActorConfig
    from actors.services import Services
    from orchestrators.graph import load_graph
    from orchestrators.search import run_search

    services = Services(ActorConfig(remember=False, data_dir=str(data_dir)))
    out: dict[str, dict[str, Any]] = {}
    try:
        for task in tasks:
            began = time.monotonic()
            result = await run_search(task, config, services=services)
            graph = load_graph(services.store, result.search_id)
            ordered = sorted(graph.nodes, key=lambda n: n.seq)
            first = next((i for i, n in enumerate(ordered, 1) if n.passed), None)
            out[task] = {"evaluations": result.evaluations, "first_correct_at": first, "best": result.best_speedup,
                         "seconds": round(time.monotonic() - began, 1), "nodes": graph.nodes,
                         "first_correct_s": _seconds_to_first(services, graph)}
            print(f"  {label} {task}: best {result.best_speedup}x, first correct at evaluation {first}", flush=True)
    finally:
        await services.aclose()
    return out


def _seconds_to_first(services: Any, graph: Any) -> float | None:
    """Seconds from the search's first event to its first correct evaluation (from the event log)."""
    events = [e for x in graph.expansions for e in services.store.events(session_id=x.session_id)]
    if not events:
        return None
    start = min(e.created_at for e in events)
    ok = sorted(e.created_at for e in events if e.message_type in ("EvalReport", "FixRequest")
                and e.payload["report"]["status"] == "ok" and e.payload["report"]["correct"])
    return round((ok[0] - start).total_seconds(), 1) if ok else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=10, help="tasks measured cold and warm")
    parser.add_argument("--warm-tasks", type=int, default=40, help="other tasks that fill the warm memory")
    parser.add_argument("--budget", type=int, default=12, help="evaluations per task and search")
    parser.add_argument("--algo", default="beam", choices=["parallel", "beam", "evolve"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tolerance", type=float, default=0.05, help="how close to the cold best counts as reached")
    parser.add_argument("--measure", default="", help="comma-separated task ids to measure instead of every fifth")
    parser.add_argument("--warm", default="", help="comma-separated task ids that fill the warm memory")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args()

    from maxkernel.logging import configure
    from orchestrators.search import SearchConfig

    configure("warning")
    for key, value in {"MAXKERNEL_EVAL_TIMING_ROUNDS": "3", "MAXKERNEL_EVAL_CORRECTNESS_SEEDS": "1"}.items():
        os.environ.setdefault(key, value)
    measured, others = split(args.tasks, args.warm_tasks, [t for t in args.measure.split(",") if t] or None,
                              [t for t in args.warm.split(",") if t] or None)
    config = SearchConfig(algorithm=args.algo, seed=args.seed, max_evaluations=args.budget)
    with tempfile.TemporaryDirectory(prefix="mk-cold-") as cold_dir, tempfile.TemporaryDirectory(prefix="mk-warm-") as warm_dir:
        print(f"cold: {len(measured)} tasks, empty memory", flush=True)
        cold = asyncio.run(run_phase(measured, config, Path(cold_dir), "cold"))
        print(f"warm-up: {len(others)} other tasks fill the memory", flush=True)
        asyncio.run(run_phase(others, config, Path(warm_dir), "fill"))
        print("warm: the same tasks, same budget", flush=True)
        warm = asyncio.run(run_phase(measured, config, Path(warm_dir), "warm"))

    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"memory reuse · {args.algo} · {args.budget} evaluations per task")
    for col in ("task", "cold first ok (evals/s)", "warm first ok (evals/s)", "cold best", "warm best",
                "cold evals to cold best", "warm evals to cold best"):
        table.add_column(col)
    rows, cold_reach, warm_reach = [], [], []
    for task in measured:
        c, w = cold[task], warm[task]
        goal = c["best"] * (1 - args.tolerance) if c["best"] else None
        cr = evals_to_reach(c["nodes"], goal)
        wr = evals_to_reach(w["nodes"], goal)
        if cr is not None:
            cold_reach.append(cr)
            warm_reach.append(wr if wr is not None else args.budget + 1)  # never reached: past the budget
        rows.append({"task": task, "cold_first": c["first_correct_at"], "warm_first": w["first_correct_at"],
                     "cold_first_s": c["first_correct_s"], "warm_first_s": w["first_correct_s"],
                     "cold_best": c["best"], "warm_best": w["best"], "cold_reach": cr, "warm_reach": wr})
        table.add_row(task, f"{c['first_correct_at']}/{c['first_correct_s']}", f"{w['first_correct_at']}/{w['first_correct_s']}",
                      f"{c['best']}", f"{w['best']}", str(cr), str(wr) if wr is not None else f">{args.budget}")
    Console(width=160).print(table)
    if cold_reach:
        ratio = statistics.mean(warm_reach) / statistics.mean(cold_reach)
        print(f"evaluations to reach the cold best: cold {statistics.mean(cold_reach):.2f}, warm "
              f"{statistics.mean(warm_reach):.2f} on average; warm/cold = {ratio:.2f} (target < 0.5)")
    else:
        ratio = None
        print("no task had a correct kernel cold: nothing to compare")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "ratio": ratio, "args": {k: str(v) for k, v in vars(args).items()}}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
