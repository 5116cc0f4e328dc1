"""Warm worker pool versus a fresh process per candidate, on the same 20 candidates, in one run.

Prints candidates/minute for both ways and their ratio. Both do the full evaluation (static scan, fresh
inputs, correctness on four input sets, integrity checks, interleaved timing); the fresh way pays for
Python, JAX, the reference's compilation and a new sandboxed worker on every candidate.

    python benchmarks/evaluator_throughput.py [--rounds 10]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "jaxbench" / "examples"
REFERENCE_TASKS = [
    "5p_Flex_Attention", "6p_Paged_Attention", "13p_Cross_Entropy", "18k_Conv2D_ReLU_BiasAdd",
    "20k_Gemm_Multiply_LeakyReLU", "22k_Conv2d_InstanceNorm_Divide", "30k_Matmul_Scaling_ResidualAdd",
    "37k_Matmul_Swish_Scaling", "44k_Matmul_Divide_GELU", "50k_Matmul_GELU_Softmax",
]


def candidates() -> list[tuple[str, str]]:
    """Twenty distinct candidates: example-kernel variants and the references of ten other tasks."""
    from jaxbench.task import load_task

    rms = (EXAMPLES / "rmsnorm_12p.py").read_text()
    gemm = (EXAMPLES / "gemm_add_relu_41k.py").read_text()
    out = [("12p_RMSNorm", rms.replace("vmem_budget_bytes=8 * 2**20", f"vmem_budget_bytes={mb} * 2**20")) for mb in (2, 4, 8, 16, 32)]
    for bm, bn, bk in ((256, 512, 1024), (512, 512, 1024), (512, 1024, 2048), (128, 256, 512), (512, 256, 2048)):
        out.append(("41k_Gemm_Add_ReLU", gemm.replace("block_m=256, block_n=512, block_k=1024", f"block_m={bm}, block_n={bn}, block_k={bk}")))
    for task_id in REFERENCE_TASKS:
        out.append((task_id, load_task(task_id).reference_path.read_text() + "\n\nkernel = reference\n"))
    return out


def run_pool(cands: list[tuple[str, str]], rounds: int, progress: Progress) -> tuple[float, int]:
    from jaxbench.evaluate import EvalConfig, Evaluator

    bar = progress.add_task("warm pool", total=len(cands))
    start = time.perf_counter()
    ok = 0
    with Evaluator(config=EvalConfig(timing_rounds=rounds)) as ev:
        for task_id, source in cands:
            ok += ev.evaluate(task_id, source).correct
            progress.advance(bar)
    return time.perf_counter() - start, ok


def run_fresh(cands: list[tuple[str, str]], rounds: int, progress: Progress) -> tuple[float, int]:
    bar = progress.add_task("fresh process each", total=len(cands))
    start = time.perf_counter()
    ok = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i, (task_id, source) in enumerate(cands):
            path = Path(tmp) / f"cand_{i}.py"
            path.write_text(source)
            proc = subprocess.run([sys.executable, "-m", "jaxbench.evaluate_one", task_id, str(path), "--rounds", str(rounds)],
                                  capture_output=True, text=True, env=dict(os.environ, JAX_PLATFORMS="cpu"))
            ok += proc.returncode == 0
            progress.advance(bar)
    return time.perf_counter() - start, ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=10, help="timing rounds per evaluation")
    args = parser.parse_args()
    cands = candidates()
    console = Console()
    with Progress(console=console) as progress:
        pool_s, pool_ok = run_pool(cands, args.rounds, progress)
        fresh_s, fresh_ok = run_fresh(cands, args.rounds, progress)
    table = Table(title=f"evaluator throughput, {len(cands)} candidates, {os.cpu_count()} cores")
    for col in ("way", "seconds", "candidates/min", "correct"):
        table.add_column(col)
    pool_rate, fresh_rate = len(cands) / pool_s * 60, len(cands) / fresh_s * 60
    table.add_row("warm pool", f"{pool_s:.1f}", f"{pool_rate:.1f}", f"{pool_ok}/{len(cands)}")
    table.add_row("fresh process each", f"{fresh_s:.1f}", f"{fresh_rate:.1f}", f"{fresh_ok}/{len(cands)}")
    console.print(table)
    console.print(f"pool / fresh ratio: [bold]{pool_rate / fresh_rate:.2f}x[/] (target at least 5x)")


if __name__ == "__main__":
    main()
