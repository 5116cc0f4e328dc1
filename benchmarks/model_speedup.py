"""Whole-layer speedups of ``optimize-model`` over the shipped model layers (a benchmark, not a test).

    python benchmarks/model_speedup.py [--layers llama31_8b_decoder ...] [--budget 300] [--tpu tpu-v6e]
                                       [--no-tpu] [--json FILE]

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


def run_layer(layer: str, budget: float, tpu: str | None, work: Path) -> dict[str, Any]:
    from maxkernel.extract import extract_task
    from orchestrators.model_opt import optimize_model

    started = time.perf_counter()
    extraction = extract_task(layer, work / "extract", timing=False)
    row: dict[str, Any] = {"layer": layer, "extract_s": time.perf_counter() - started,
                           "regions": len(extraction.regions)}
    cpu = optimize_model(layer, out=work / "cpu", budget_s=budget, target="cpu")
    row.update(correct=cpu.correct, ref_ms=cpu.ref_ms, kernel_ms=cpu.kernel_ms, speedup=cpu.speedup or 1.0,
               amdahl=cpu.amdahl_bound, covered=sum(r.share for r in cpu.regions if r.status == "kept"))
    if tpu:
        modelled = optimize_model(layer, out=work / tpu, budget_s=budget, target=tpu)
        row.update(tpu_correct=modelled.correct, tpu_speedup=modelled.speedup or 1.0)
    return row


def main(argv: list[str]) -> int:
    from jaxbench.task import list_models

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", nargs="*", default=None)
    parser.add_argument("--budget", type=float, default=300.0, help="seconds per layer and target")
    parser.add_argument("--tpu", default="tpu-v6e")
    parser.add_argument("--no-tpu", action="store_true", help="measure on cpu only")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    layers = args.layers or [t.id for t in list_models()]
    work = Path(tempfile.mkdtemp(prefix="model-speedup-"))
    os.environ["MAXKERNEL_DATA_DIR"] = str(work / "data")
    rows = [run_layer(layer, args.budget, None if args.no_tpu else args.tpu, work / layer) for layer in layers]
    table = Table(title=f"optimize-model, {args.budget:.0f} s per layer and target")
    cols = ["layer", "regions", "extract s", "ref ms", "layer ms", "speedup (cpu, measured)", "covered", "Amdahl"]
    if not args.no_tpu:
        cols.append(f"speedup ({args.tpu}, modelled)")
    for col in cols:
        table.add_column(col)
    for r in rows:
        cells = [r["layer"], str(r["regions"]), f"{r['extract_s']:.1f}", f"{r['ref_ms'] or 0:.1f}",
                 f"{r['kernel_ms'] or 0:.1f}", f"{r['speedup']:.2f}x" + ("" if r["correct"] else " (failed)"),
                 f"{100 * r['covered']:.0f}%", f"{r['amdahl']:.2f}x"]
        if not args.no_tpu:
            cells.append(f"{r['tpu_speedup']:.2f}x" + ("" if r["tpu_correct"] else " (failed)"))
        table.add_row(*cells)
    console = Console()
    console.print(table)
    console.print(f"geometric mean (cpu, measured): {_geomean([r['speedup'] for r in rows]):.2f}x; correct "
                  f"{sum(r['correct'] for r in rows)}/{len(rows)}", highlight=False)
    if not args.no_tpu:
        console.print(f"geometric mean ({args.tpu}, modelled): {_geomean([r['tpu_speedup'] for r in rows]):.2f}x",
                      highlight=False)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
