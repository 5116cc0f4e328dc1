"""Memory benchmark: insert rate and recall latency at two sizes, measured side by side in one run.

Fills a fresh memory (SQLite file + embedded Chroma, or whatever MAXKERNEL_STORE_URL /
MAXKERNEL_CHROMA_URL name) with synthetic verified kernels, then times ``recall_kernels`` on
synthetic task signatures. Targets: recall p50 under 20 ms at 100k kernels, and p50 growing less
than 2x from 10k to 100k.

    python benchmarks/memory_recall.py                      # 10k and 100k (minutes)
    python benchmarks/memory_recall.py --sizes 1000,5000    # a quick run
"""

from __future__ import annotations

import argparse
import logging
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import structlog
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
from rich.table import Table

from jaxbench.report import EvalReport
from maxkernel.analysis.signature import TaskSignature, TensorSpec, shape_class
from maxkernel.config import load_settings
from memory import Memory, NewKernel

CATEGORIES = ["matmul", "attention", "normalization", "reduction", "elementwise", "conv", "moe", "recurrence", "gather"]
HEADS = ["dot_general", "conv_general_dilated", "reduce_sum", "reduce_max", "cumsum", "gather", "ragged_dot_general"]
ELEMENTWISE = ["add", "sub", "mul", "div", "max", "min", "exp", "log", "tanh", "logistic", "erfc", "rsqrt",
               "square", "neg", "abs", "select_n", "iota", "lt", "ge", "integer_pow", "sqrt", "pow"]  # fmt: skip
TARGETS = ["cpu"] * 7 + ["tpu-v5e", "tpu-v6e", "gpu"]
WORDS = ["block", "tile", "acc", "scratch", "vmem", "grid", "program_id", "dma", "sem", "row", "col", "lane",
         "sublane", "epilogue", "carry", "mask", "bias", "scale", "stats", "pipeline"]  # fmt: skip


def synthetic_signature(rng: random.Random, task_id: str) -> TaskSignature:
    """A plausible task structure: a heavy head op, an epilogue, sometimes a second heavy op."""
    prims = [rng.choice(HEADS)] + rng.choices(ELEMENTWISE, k=rng.randint(2, 12))
    if rng.random() < 0.3:
        prims += [rng.choice(HEADS)] + rng.choices(ELEMENTWISE, k=rng.randint(1, 6))
    ranks = [rng.choice([1, 2, 3, 4]) for _ in range(rng.randint(1, 4))]
    inputs = [TensorSpec(shape=[rng.choice([64, 128, 512, 1024])] * r, dtype="float32") for r in ranks]
    outputs = [inputs[0]]
    return TaskSignature(
        task_id=task_id,
        category=rng.choice(CATEGORIES),
        primitives=prims,
        inputs=inputs,
        outputs=outputs,
        shape_class=shape_class(inputs, outputs),
    )


def synthetic_code(rng: random.Random, index: int) -> str:
    body = "\n".join(
        f"    {rng.choice(WORDS)}_{i} = {rng.choice(WORDS)}_ref[...] * {rng.random():.3f}  # {rng.choice(WORDS)}"
        for i in range(rng.randint(8, 24))
    )
    block = rng.choice([128, 256, 512])
    return (
        "import jax\nfrom jax.experimental import pallas as pl\n\n\n"
        f"def _body_{index}(x_ref, o_ref):\n{body}\n    o_ref[...] = x_ref[...]\n\n\n"
        f"def kernel(x):\n    return pl.pallas_call(_body_{index}, grid=(x.shape[0] // {block},),\n"
        f"        in_specs=[pl.BlockSpec(({block}, x.shape[1]), lambda i: (i, 0))],\n"
        "        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)\n"
    )


def synthetic_report(rng: random.Random, task_id: str) -> EvalReport:
    ref_ms = rng.uniform(1, 200)
    speedup = rng.uniform(0.8, 6.0)
    return EvalReport(
        task=task_id, target=rng.choice(TARGETS), status="ok", correct=True, max_abs_err=rng.uniform(0, 1e-5),
        ref_ms=ref_ms, kernel_ms=ref_ms / speedup, speedup=speedup, cv=0.02, basis="measured", label="pallas-kernel",
    )  # fmt: skip


def fill(memory: Memory, size: int, rng: random.Random, batch: int, console: Console) -> float:
    """Insert ``size`` kernels over ``size // 20`` tasks; returns kernels per second."""
    pool = [synthetic_signature(rng, f"syn_{i}") for i in range(max(size // 20, 10))]
    start = time.perf_counter()
    with Progress(
        "insert", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console, transient=True
    ) as progress:
        bar = progress.add_task("insert", total=size)
        for offset in range(0, size, batch):
            n = min(batch, size - offset)
            sigs = [pool[rng.randrange(len(pool))] for _ in range(n)]
            entries = [
                NewKernel(
                    task_id=sig.task_id,
                    code=synthetic_code(rng, offset + i),
                    report=synthetic_report(rng, sig.task_id),
                    strategy=rng.choice(["tile", "fuse epilogue", "online softmax", "double buffer", "split k"]),
                    produced_by="benchmark",
                )
                for i, sig in enumerate(sigs)
            ]
            memory.store_kernels(entries, tasks=sigs)
            progress.advance(bar, n)
    return size / (time.perf_counter() - start)


def time_recall(memory: Memory, rng: random.Random, queries: int, k: int, target: str | None) -> list[float]:
    """Latency of ``recall_kernels`` in ms, on task signatures recall has not seen before."""
    probes = [synthetic_signature(rng, f"probe_{i}") for i in range(queries)]
    for sig in probes[:10]:  # warm-up: first queries load the index
        memory.recall_kernels(sig, k=k, target=target)
    out = []
    for sig in probes:
        start = time.perf_counter()
        hits = memory.recall_kernels(sig, k=k, target=target)
        out.append((time.perf_counter() - start) * 1000)
        assert len(hits) == k, f"recall returned {len(hits)} hits, expected {k}"
    return out


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000", help="comma-separated kernel counts (default: 10000,100000)")
    parser.add_argument("--queries", type=int, default=300, help="timed recalls per size")
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--batch", type=int, default=2000, help="kernels per insert transaction")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    console = Console()
    rows = []
    for size in sizes:
        root = Path(tempfile.mkdtemp(prefix=f"memory-bench-{size}-"))
        try:
            settings = load_settings(data_dir=str(root))
            rng = random.Random(args.seed)
            with Memory.open(settings) as memory:
                rate = fill(memory, size, rng, args.batch, console)
                filtered = time_recall(memory, rng, args.queries, args.k, "cpu")
                unfiltered = time_recall(memory, rng, args.queries, args.k, None)
            rows.append((size, rate, filtered, unfiltered))
            console.print(
                f"{size:>7} kernels: insert {rate:,.0f}/s, recall (target=cpu) "
                f"p50 {statistics.median(filtered):.2f} ms p95 {percentile(filtered, 95):.2f} ms"
            )
        finally:
            shutil.rmtree(root, ignore_errors=True)

    table = Table(title=f"memory recall (k={args.k}, {args.queries} queries per size)")
    for column in ("kernels", "insert /s", "p50 ms", "p95 ms", "p50 ms (no filter)", "p95 ms (no filter)"):
        table.add_column(column, justify="right")
    for size, rate, filtered, unfiltered in rows:
        table.add_row(
            f"{size:,}", f"{rate:,.0f}",
            f"{statistics.median(filtered):.2f}", f"{percentile(filtered, 95):.2f}",
            f"{statistics.median(unfiltered):.2f}", f"{percentile(unfiltered, 95):.2f}",
        )  # fmt: skip
    console.print(table)
    if len(rows) >= 2:
        (small, _, f_small, u_small), (large, _, f_large, u_large) = rows[0], rows[-1]
        ratio = statistics.median(f_large) / statistics.median(f_small)
        ratio_u = statistics.median(u_large) / statistics.median(u_small)
        console.print(f"p50 growth {small:,} -> {large:,}: {ratio:.2f}x (target=cpu), {ratio_u:.2f}x (no filter)")
        p50 = statistics.median(f_large)
        console.print(
            f"targets: p50 at {large:,} under 20 ms: {'yes' if p50 < 20 else 'NO'} ({p50:.2f} ms); "
            f"growth under 2x: {'yes' if ratio < 2 else 'NO'} ({ratio:.2f}x)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
