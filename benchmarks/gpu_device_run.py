"""Measuring GPU kernels on a lent GPU host with JaxBench's evaluator alone (a benchmark, not a test).

Two steps. Here (no GPU), ``prepare`` writes the kernel files (ours: the GPU template the rules propose;
theirs: JAX's own GPU kernel from ``benchmarks/gpu_suite.py``; the reference) and the model's figures for
one chip into a folder:

    python benchmarks/gpu_device_run.py prepare --chip h200 --out shared/gpu_run

On the GPU host, ``measure`` imports only ``jaxbench`` (jax, numpy, pydantic, yaml), evaluates every
kernel file at ``full`` size with timing on, and writes ``results.json``: measured and modelled ms per
kernel, the model's error, and the Spearman rank correlation of model and measurement over all of them.
If the sandbox's address-space limit keeps CUDA from starting, it says so and measures without that limit;
anything that cannot run is written down with why:

    python benchmarks/gpu_device_run.py measure --dir shared/gpu_run
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TASKS = ("1p_Flash_Attention",)


def prepare(chip: str, out: Path, tasks: list[str]) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_suite import EXPERT_SOURCES, ours_source

    from jaxbench.task import load_task
    from maxkernel.rules.strategy import reference_source
    from maxkernel.targets.gpu_model import model_gpu_candidate, model_gpu_reference

    out.mkdir(parents=True, exist_ok=True)
    plan = []
    for name in tasks:
        task = load_task(name)
        kernels = {"reference": reference_source(task)}
        found = ours_source(task, chip)
        if found is not None:
            kernels["ours"] = found[1]
        if name in EXPERT_SOURCES:
            kernels["theirs"] = EXPERT_SOURCES[name]
        for who, source in kernels.items():
            path = out / f"{name}__{who}.py"
            path.write_text(source)
            model = (model_gpu_reference(task, chip) if who == "reference"
                     else model_gpu_candidate(source, task, chip))
            plan.append({"task": name, "who": who, "file": path.name, "model_ms": model.time_ms})
    (out / "plan.json").write_text(json.dumps({"chip": chip, "kernels": plan}, indent=2))


def _spearman(xs: list[float], ys: list[float]) -> float | None:
    if len(xs) < 3:
        return None

    def ranks(values: list[float]) -> list[float]:
        order = sorted(range(len(values)), key=values.__getitem__)
        out = [0.0] * len(values)
        for rank, i in enumerate(order):
            out[i] = float(rank)
        return out

    rx, ry = ranks(xs), ranks(ys)
    n = len(xs)
    return 1 - 6 * sum((a - b) ** 2 for a, b in zip(rx, ry)) / (n * (n * n - 1))


def measure(folder: Path) -> None:
    import jax

    from jaxbench.evaluate import EvalConfig, Evaluator
    from jaxbench.pool import WorkerPool
    from jaxbench.task import load_task

    plan = json.loads((folder / "plan.json").read_text())
    result: dict[str, Any] = {"chip": plan["chip"], "jax": jax.__version__, "kernels": [], "notes": []}
    try:
        devices = jax.devices("gpu")
    except RuntimeError as exc:
        devices = []
        result["notes"].append(f"no GPU: {exc}")
    if devices:
        result["device"] = devices[0].device_kind
    memory = 8 << 30
    for entry in plan["kernels"]:
        source = (folder / entry["file"]).read_text()
        task = load_task(entry["task"])
        start = time.perf_counter()
        report = Evaluator(WorkerPool(1, memory_bytes=memory), EvalConfig()).evaluate(
            task, source, target="gpu", size="full")
        if report.status != "ok" and memory and "CUDA" in (report.reason or ""):
            result["notes"].append(f"the sandbox's {memory >> 30} GiB address-space limit stops CUDA "
                                   f"({report.reason[:200]}); measuring without it")
            memory = 0
            report = Evaluator(WorkerPool(1, memory_bytes=memory), EvalConfig()).evaluate(
                task, source, target="gpu", size="full")
        row = {**entry, "status": report.status, "reason": report.reason, "wall_s": time.perf_counter() - start,
               "measured_ms": report.kernel_ms}
        if report.kernel_ms:
            row["model_error"] = entry["model_ms"] / report.kernel_ms - 1
        result["kernels"].append(row)
        (folder / "results.json").write_text(json.dumps(result, indent=2))
    timed = [k for k in result["kernels"] if k.get("measured_ms")]
    result["rank_correlation"] = _spearman([k["model_ms"] for k in timed], [k["measured_ms"] for k in timed])
    (folder / "results.json").write_text(json.dumps(result, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="step", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--chip", default="h200")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--tasks", nargs="*", default=list(DEFAULT_TASKS))
    m = sub.add_parser("measure")
    m.add_argument("--dir", type=Path, required=True)
    args = parser.parse_args()
    if args.step == "prepare":
        prepare(args.chip, args.out, args.tasks)
    else:
        measure(args.dir)


if __name__ == "__main__":
    main()
