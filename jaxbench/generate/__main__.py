"""``python -m jaxbench.generate --seed S --count N --out DIR [--check]``: draw tasks as task folders.

Without ``--seed`` one is drawn from the clock and printed. ``--check`` runs ``jaxbench.task_check`` on every
folder written and exits 1 if any fails.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from jaxbench.generate.draw import draw, task_id
from jaxbench.generate.write import write_task


def fresh_seed() -> int:
    """A seed from the clock: never the same two runs apart."""
    return time.time_ns() % 1_000_000_007


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jaxbench.generate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, help="default: drawn from the clock (printed)")
    parser.add_argument("--count", type=int, default=40)
    parser.add_argument("--out", type=Path, required=True, help="folder to write the task folders into")
    parser.add_argument("--check", action="store_true", help="run task_check on every task written")
    args = parser.parse_args(argv)
    if args.count < 1:
        print("error: --count must be at least 1", file=sys.stderr)
        return 2
    seed = fresh_seed() if args.seed is None else args.seed
    print(f"seed {seed}")
    failed = 0
    for slot, draft in draw(seed, args.count):
        tid = task_id(seed, slot, draft)
        error = write_task(draft, args.out / tid, tid)
        line = f"{tid:48s} {draft.family:18s} {draft.dtype:9s} {'decode' if draft.decode else 'prefill':7s} ref err {error:.2e}"
        if args.check:
            from jaxbench.task import load_task
            from jaxbench.task_check import check_task

            res = check_task(load_task(args.out / tid))
            line += f"  {'ok' if res.ok else 'FAIL'} {res.ref_ms:.1f} ms" + ("".join(f"\n    problem: {p}" for p in res.problems))
            failed += not res.ok
        print(line, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
