"""Evaluate one candidate in this process and print the report as JSON (``python -m jaxbench.evaluate_one``).

The fresh-process way of evaluating, kept as the baseline the warm worker pool is measured against.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from jaxbench.evaluate import EvalConfig, Evaluator


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("task")
    parser.add_argument("candidate", type=Path)
    parser.add_argument("--size", default="cpu")
    parser.add_argument("--rounds", type=int, default=EvalConfig.timing_rounds)
    args = parser.parse_args(argv)
    with Evaluator(config=EvalConfig(timing_rounds=args.rounds)) as ev:
        report = ev.evaluate(args.task, args.candidate.read_text(), size=args.size, filename=str(args.candidate))
    sys.stdout.write(report.model_dump_json() + "\n")
    return 0 if report.correct else 1


if __name__ == "__main__":
    sys.exit(main())
