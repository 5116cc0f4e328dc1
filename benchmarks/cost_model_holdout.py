"""Learned cost model against the hand-written order, on tasks it was not trained on, from recorded measurements.

The memory benchmark (``memory_reuse.py``) compares the two orders by running sessions, where one reading of
a kernel moves by several percent and a session reaches its best within a few evaluations: the order of
trials decides little there. This benchmark asks the narrower question directly. It reads every configuration
the given data dirs measured (``--data``: data dirs, or folders that hold them, such as a memory benchmark's
``--keep`` folder), splits the tasks into ``--folds`` folds, trains the model on the other folds' tasks, and
for every strategy of a held-out task with at least ``--min-configs`` measured configurations ranks those
configurations both ways. As in a tuning session the draft (the configuration the plan measured first) stays
first in both orders; the order of the rest is compared:

- ``to_best``: how many trials each order needs to measure the group's best configuration;
- ``regret@2``: how far (log speedup) the best of the first two trials lies below the group's best.

Nothing here is timed: the figures are recorded readings, so the comparison is the same on every machine.

    python benchmarks/cost_model_holdout.py --data /tmp/reuse-keep --folds 5 --json FILE
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from pydantic import BaseModel

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("JAX_PLATFORMS", "cpu")


class Group(BaseModel):
    """One strategy on one held-out task: its measured configurations and how each order ranks them."""

    task: str
    strategy: str
    configs: int
    best: float
    hand_to_best: int
    learned_to_best: int
    hand_regret2: float
    learned_regret2: float


def data_dirs(paths: list[Path]) -> list[Path]:
    """Each given data dir, or every data dir (a folder with ``maxkernel.db``) under a given folder."""
    found: list[Path] = []
    for path in paths:
        if (path / "maxkernel.db").exists():
            found.append(path)
        else:
            found.extend(sorted(p.parent for p in path.glob("**/maxkernel.db")))
    return found


def key_of(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True, default=str)


def read(dirs: list[Path], target: str) -> tuple[list[Any], dict[str, Any]]:
    """Every measured configuration (each session once: a warm dir holds copies of the cold runs' logs) and
    the signature of each measured task."""
    from maxkernel.config import load_settings
    from memory import Memory

    rows: list[Any] = []
    seen: set[tuple[str | None, str, str, bool]] = set()
    signatures: dict[str, Any] = {}
    for data in dirs:
        with Memory.open(load_settings(data_dir=str(data))) as memory:
            for r in memory.measurements(target):
                key = (r.session_id, r.strategy, key_of(r.params), r.tuned)
                if key not in seen:
                    seen.add(key)
                    rows.append(r)
            missing = sorted({r.task_id for r in rows} - set(signatures))
            if missing:
                signatures.update(memory.signatures(missing))
    return rows, signatures


def position(order: list[str], best: set[str]) -> int:
    return next(i for i, k in enumerate(order, 1) if k in best)


def regret(order: list[str], value: dict[str, float], k: int) -> float:
    top = max(value.values())
    return round(top - max(value[c] for c in order[:k]), 4)


def compare(rows: list[Any], signatures: dict[str, Any], folds: int, min_configs: int, target: str) -> list[Group]:
    from actors.priors import samples_from, tiled_extents
    from maxkernel.tuning import learned
    from maxkernel.tuning.strategy import order as hand_order

    features = {t: learned.task_features(s) for t, s in signatures.items()}
    tasks = sorted(features)
    fold_of = {t: i % folds for i, t in enumerate(tasks)}
    groups: dict[tuple[str, str], list[Any]] = defaultdict(list)
    for r in rows:
        if r.task_id in features and r.kind not in ("recalled", "reference") and r.space:
            groups[(r.task_id, r.strategy)].append(r)
    out: list[Group] = []
    for f in range(folds):
        train = [r for r in rows if r.task_id in fold_of and fold_of[r.task_id] != f]
        model = learned.LearnedCostModel.fit(samples_from(train, features))
        if model is None:
            continue
        for (task, strategy), measured in sorted(groups.items()):
            if fold_of.get(task) != f:
                continue
            logs: dict[str, list[float]] = defaultdict(list)
            params: dict[str, dict[str, Any]] = {}
            for r in measured:
                k = key_of(r.params)
                params[k] = r.params
                logs[k].append(math.log(max(r.speedup, learned.FAILED_SPEEDUP)) if r.passed and r.speedup
                               else math.log(learned.FAILED_SPEEDUP))
            if len(params) < min_configs:
                continue
            value = {k: statistics.mean(v) for k, v in logs.items()}
            drafts = [key_of(r.params) for r in measured if not r.tuned]
            first = drafts[0] if drafts else next(iter(params))
            rest = [params[k] for k in params if k != first]
            extents = tiled_extents(measured[0].extents, measured[0].space)
            hand = [first] + [key_of(c) for c in hand_order(rest, extents, target, 0)]
            ranked = model.order(features[task], strategy, measured[0].kind, rest, extents)
            by_model = [first] + [key_of(c) for c in ranked]
            top = max(value.values())
            best = {k for k, v in value.items() if v >= top - 1e-9}
            out.append(Group(task=task, strategy=strategy, configs=len(params), best=round(math.exp(top), 4),
                             hand_to_best=position(hand, best), learned_to_best=position(by_model, best),
                             hand_regret2=regret(hand, value, 2), learned_regret2=regret(by_model, value, 2)))
    return out


def summary(groups: list[Group]) -> dict[str, Any]:
    if not groups:
        return {"groups": 0}
    return {"groups": len(groups),
            "hand_to_best_mean": round(statistics.mean(g.hand_to_best for g in groups), 3),
            "learned_to_best_mean": round(statistics.mean(g.learned_to_best for g in groups), 3),
            "learned_sooner": sum(g.learned_to_best < g.hand_to_best for g in groups),
            "hand_sooner": sum(g.hand_to_best < g.learned_to_best for g in groups),
            "hand_regret2_mean": round(statistics.mean(g.hand_regret2 for g in groups), 4),
            "learned_regret2_mean": round(statistics.mean(g.learned_regret2 for g in groups), 4)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="comma-separated data dirs, or folders that hold them")
    parser.add_argument("--target", default="cpu")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--min-configs", type=int, default=3, help="measured configurations a group needs")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    from rich.console import Console
    from rich.table import Table

    from maxkernel.logging import configure

    configure("warning")
    given = [Path(p) for p in args.data.split(",") if p]
    missing = [str(p) for p in given if not p.exists()]
    if missing:
        print(f"error: --data: no such folder: {', '.join(missing)}", file=sys.stderr)
        return 2
    dirs = data_dirs(given)
    if not dirs:
        print(f"error: --data: no data dir (a folder with maxkernel.db) under {args.data}", file=sys.stderr)
        return 2
    rows, signatures = read(dirs, args.target)
    groups = compare(rows, signatures, max(2, args.folds), args.min_configs, args.target)
    table = Table(title=f"held-out tuning order · {len(dirs)} data dirs · {len(rows)} measured configurations")
    for col in ("task", "strategy", "configs", "best", "to best: hand", "learned", "regret@2: hand", "learned"):
        table.add_column(col)
    for g in groups:
        table.add_row(g.task, g.strategy, str(g.configs), f"{g.best}x", str(g.hand_to_best), str(g.learned_to_best),
                      f"{g.hand_regret2}", f"{g.learned_regret2}")
    Console(width=200).print(table)
    result = summary(groups)
    print(json.dumps(result))
    if args.json:
        args.json.write_text(json.dumps({**result, "rows": [g.model_dump() for g in groups]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
