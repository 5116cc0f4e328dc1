"""Whole-layer speedups of ``optimize-model`` over the shipped model layers (a benchmark, not a test).

    python benchmarks/model_speedup.py [--layers llama31_8b_decoder ...] [--budget 300] [--tpu tpu-v6e]
                                       [--no-tpu | --no-cpu] [--json FILE]

Per layer: extraction seconds, regions found, reference ms and optimized layer ms (measured, cpu), the
layer's measured speedup, the share of time covered by regions that got a faster kernel, the Amdahl bound
those regions imply, and the modelled speedup on the TPU target. At the end: geometric means. A layer
without a correct candidate counts 1.0x. Every run uses a fresh data dir.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else 1.0


def run_layer(layer: str, budget: float, tpu: str | None, work: Path, cpu: bool = True) -> dict[str, Any]:
    from maxkernel.extract import extract_task
    from orchestrators.model_opt import optimize_model

    started = time.perf_counter()
    extraction = extract_task(layer, work / "extract", timing=False)
    row: dict[str, Any] = {"layer": layer, "extract_s": time.perf_counter() - started,
                           "regions": len(extraction.regions)}
    if cpu:
        measured = optimize_model(layer, out=work / "cpu", budget_s=budget, target="cpu")
        row.update(correct=measured.correct, ref_ms=measured.ref_ms, kernel_ms=measured.kernel_ms,
                   speedup=measured.speedup or 1.0, amdahl=measured.amdahl_bound,
                   covered=sum(r.share for r in measured.regions if r.status == "kept"))
    if tpu:
        modelled = optimize_model(layer, out=work / tpu, budget_s=budget, target=tpu)
        row.update(tpu_correct=modelled.correct, tpu_speedup=modelled.speedup or 1.0,
                   tpu_ref_ms=modelled.ref_ms, tpu_kernel_ms=modelled.kernel_ms, tpu_amdahl=modelled.amdahl_bound,
                   tpu_covered=sum(r.share for r in modelled.regions if r.status == "kept"),
                   tpu_regions=[f"{r.task_id.split('__')[-1]}: {r.status} {r.note}".strip() for r in modelled.regions],
                   tpu_notes=modelled.notes)
    return row


def main(argv: list[str]) -> int:
    from jaxbench.task import list_models

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", nargs="*", default=None)
    parser.add_argument("--budget", type=float, default=300.0, help="seconds per layer and target")
    parser.add_argument("--tpu", default="tpu-v6e")
    parser.add_argument("--no-tpu", action="store_true", help="measure on cpu only")
    parser.add_argument("--no-cpu", action="store_true", help="model on the TPU target only")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.no_tpu and args.no_cpu:
        parser.error("--no-tpu and --no-cpu leave nothing to run")
    layers = args.layers or [t.id for t in list_models()]
    work = Path(tempfile.mkdtemp(prefix="model-speedup-"))
    os.environ["MAXKERNEL_DATA_DIR"] = str(work / "data")
    tpu = None if args.no_tpu else args.tpu
    rows: list[dict[str, Any]] = []
    for layer in layers:  # the JSON is rewritten after every layer, so a long run keeps what it finished
        rows.append(run_layer(layer, args.budget, tpu, work / layer, cpu=not args.no_cpu))
        if args.json:
            args.json.write_text(json.dumps(rows, indent=2))
    table = Table(title=f"optimize-model, {args.budget:.0f} s per layer and target")
    cols = ["layer", "regions", "extract s"]
    if not args.no_cpu:
        cols += ["ref ms", "layer ms", "speedup (cpu, measured)", "covered", "Amdahl"]
    if tpu:
        cols += [f"ref ms ({tpu}, modelled)", "layer ms (modelled)", f"speedup ({tpu}, modelled)", "covered (tpu)"]
    for col in cols:
        table.add_column(col)
    for r in rows:
        cells = [r["layer"], str(r["regions"]), f"{r['extract_s']:.1f}"]
        if not args.no_cpu:
            cells += [f"{r['ref_ms'] or 0:.1f}", f"{r['kernel_ms'] or 0:.1f}",
                      f"{r['speedup']:.2f}x" + ("" if r["correct"] else " (failed)"), f"{100 * r['covered']:.0f}%",
                      f"{r['amdahl']:.2f}x"]
        if tpu:
            cells += [f"{r['tpu_ref_ms'] or 0:.2f}", f"{r['tpu_kernel_ms'] or 0:.2f}",
                      f"{r['tpu_speedup']:.2f}x" + ("" if r["tpu_correct"] else " (failed)"),
                      f"{100 * r['tpu_covered']:.0f}%"]
        table.add_row(*cells)
    console = Console()
    console.print(table)
    if not args.no_cpu:
        console.print(f"geometric mean (cpu, measured): {_geomean([r['speedup'] for r in rows]):.2f}x; correct "
                      f"{sum(r['correct'] for r in rows)}/{len(rows)}", highlight=False)
    if tpu:
        console.print(f"geometric mean ({tpu}, modelled): {_geomean([r['tpu_speedup'] for r in rows]):.2f}x; "
                      f"correct {sum(r['tpu_correct'] for r in rows)}/{len(rows)}", highlight=False)
        for r in rows:
            console.print(f"{r['layer']} ({tpu}): " + "; ".join(r["tpu_regions"] + r["tpu_notes"]),
                          highlight=False, markup=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
