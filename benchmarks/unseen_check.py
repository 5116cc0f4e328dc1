"""The unseen-size check on the Pallas winners of a TPU target (a benchmark, not a test).

    python benchmarks/unseen_check.py --target tpu-v6e [--tasks 13p_Cross_Entropy ...] [--seeds 1] [--json FILE]

For every task a TPU template won in the whole-suite tpu-v6e run of docs/targets-tpu.md (and the templates that won
none on the task they were written for), render that template with the parameters it won with and
evaluate it for the target, as ``maxkernel eval TASK FILE --target T`` does: lowered for the chip, checked
in TPU interpret mode with the TPU's matmul numerics at the candidate's check size, then at an unseen size
drawn from the task's free parameters (bounded by its grid steps, like the ``cpu`` check). Prints per task
the template, its parameters, the check size, the unseen size run and its verdict, and the count of
winners that passed. ``--seeds`` sets the correctness seeds at the check size (the unseen run is one
input set whatever it is); ``--timeout-s`` the evaluator's wall-clock budget for one candidate, all its runs
together (the evaluator's default is 120 s; on a loaded machine the unseen run, which comes last, is what
a short budget cuts). A refused draw (the template raising for a size it does not serve) is
``incorrect`` and counts as failed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# The best of every task whose winner is a TPU template in the "Whole suite on tpu-v6e" table of docs/targets-tpu.md
# (1 December 2026), with the parameters it won with; the grouped matmul at its later v6e default; the
# rows and MoE templates, which won none, at their defaults on the task they were written for; 13p's
# cross-entropy by the general rules at their defaults (they replaced the template that won it then).
WINNERS: dict[str, tuple[str, dict[str, Any]]] = {
    "1p_Flash_Attention": ("flash_attention", {"block_q": 1024, "block_k": 1024}),
    "2p_GQA_Attention": ("flash_attention", {"block_q": 512, "block_k": 1024}),
    "4p_Sparse_Attention": ("flash_attention", {"block_q": 1024, "block_k": 1024}),
    "5p_Flex_Attention": ("flash_attention", {"block_q": 512}),
    "6p_Paged_Attention": ("paged_attention", {"pages_per_block": 256}),
    "11p_Megablox_GMM": ("grouped_matmul", {}),
    "12p_RMSNorm": ("tpu_rows", {}),
    "13p_Cross_Entropy": ("fused_grid", {}),
    "14p_Ragged_Dot": ("grouped_matmul", {}),
    "18k_Conv2D_ReLU_BiasAdd": ("tpu_conv", {"block_n": 128, "block_c": 64, "block_d": 64, "passes": 3}),
    "22k_Conv2d_InstanceNorm_Divide": ("tpu_conv", {"block_n": 128, "block_c": 64, "block_d": 64, "passes": 3}),
    "33k_Conv3d_Mish_Tanh": ("tpu_conv", {"block_n": 64, "block_c": 32, "block_d": 2, "passes": 3}),
    "39k_Conv2d_GELU_GlobalAvgPool": ("tpu_conv", {"block_n": 64, "block_c": 8, "block_d": 32, "passes": 3}),
    "32k_Gemm_Sigmoid_LogSumExp": ("tpu_mlp", {"block_m": 1024, "block_h": 256, "passes": 3}),
}
_GEMM = {"block_m": 1024, "block_n": 2048, "block_k": 512, "passes": 3}
for _task, _rows in [("19k_Matmul_Subtract_Multiply_ReLU", None), ("20k_Gemm_Multiply_LeakyReLU", None),
                     ("24k_Matmul_Scale_ResidualAdd_Clamp_LogSumExp_Mish", 128),
                     ("26k_BMM_InstanceNorm_Sum_ResidualAdd_Multiply", 32), ("27k_Matmul_Mish_Mish", None),
                     ("29k_Matmul_Swish_Sum_GroupNorm", 128), ("30k_Matmul_Scaling_ResidualAdd", None),
                     ("31k_Gemm_BatchNorm_GELU_ReLU", None), ("35k_Gemm_Scaling_Hardtanh_GELU", None),
                     ("36k_Matmul_Sigmoid_Sum", 128), ("37k_Matmul_Swish_Scaling", None),
                     ("38k_Matmul_Dropout_Softmax", None), ("40k_Gemm_GroupNorm_Min_BiasAdd", None),
                     ("41k_Gemm_Add_ReLU", None), ("42k_Gemm_Max_Subtract_GELU", None),
                     ("43k_Gemm_BatchNorm_Scaling_Softmax", None), ("44k_Matmul_Divide_GELU", None),
                     ("45k_Gemm_GroupNorm_Swish_Multiply_Swish", 64), ("47k_Matmul_Add_Swish_Tanh_GELU_Hardtanh", None),
                     ("48k_Matmul_BatchNorm_BiasAdd_Divide_Swish", None), ("49k_Matmul_AvgPool_GELU_Scale_Max", 128),
                     ("50k_Matmul_GELU_Softmax", 64)]:
    WINNERS[_task] = ("tpu_gemm", {**_GEMM, **({"block_rows": _rows} if _rows else {})})
WINNERS["10p_Sparse_MoE"] = ("tpu_moe", {})  # last: its check draws eight experts' weights per input set


def _render(task: Any, template: str, params: dict[str, Any], target: str) -> tuple[str, dict[str, Any]]:
    """The template's source for ``task`` with ``params`` over its defaults; a parameter outside the
    template's space here is an error (the winner would not be what is checked)."""
    from maxkernel.analysis import analyze_task
    from maxkernel.rules.strategy import propose_strategies, render

    name = f"template:{template}"
    found = [s for s in propose_strategies(task, analyze_task(task, target), target) if s.name == name]
    if not found:
        raise ValueError(f"{template} does not apply to {task.id} on {target}")
    strategy = found[0]
    for key, value in params.items():
        if key not in strategy.space or value not in strategy.space[key]:
            raise ValueError(f"{template} on {task.id}: {key}={value} is not in its space {strategy.space.get(key)}")
    chosen = {**strategy.params, **params}
    return render(task, strategy, chosen), chosen


def _row(task_id: str, target: str, evaluator: Any) -> dict[str, Any]:
    from jaxbench.task import load_task
    from maxkernel.evaluation import evaluate_candidate

    template, params = WINNERS[task_id]
    task = load_task(task_id)
    started = time.monotonic()
    row: dict[str, Any] = {"task": task_id, "template": template}
    try:
        source, row["params"] = _render(task, template, params, target)
    except Exception as exc:  # a template that cannot render its winner is a finding, not a crash
        return {**row, "params": params, "status": "render_error", "reason": f"{type(exc).__name__}: {exc}",
                "unseen": "", "passed": False, "s": round(time.monotonic() - started)}
    report = evaluate_candidate(task, source, target=target, evaluator=evaluator)
    checked = report.check("priced_is_checked")
    unseen = report.check("correct_unseen_size")
    row.update(status=report.status, reason=report.reason, s=round(time.monotonic() - started),
               check=checked.detail.split(":")[0].removeprefix("checked at ") if checked and checked.passed else "",
               unseen=unseen.detail if unseen else "", passed=bool(unseen and unseen.passed and report.status == "ok"))
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="tpu-v6e", help="a TPU target, e.g. tpu-v6e")
    parser.add_argument("--tasks", nargs="*", help="a subset of the winners' tasks (default: all)")
    parser.add_argument("--seeds", type=int, default=1, help="correctness seeds at the check size")
    parser.add_argument("--timeout-s", type=float, default=120.0,
                        help="the evaluator's wall-clock budget per candidate (its default; a TPU check may get more)")
    parser.add_argument("--json", type=Path, help="write the rows as JSON (rewritten after every task)")
    args = parser.parse_args(argv)
    console = Console(stderr=True)
    from maxkernel.targets.names import TargetError, parse_target

    try:
        kind, _ = parse_target(args.target)
    except TargetError as exc:
        console.print(str(exc))
        return 2
    unknown = [t for t in args.tasks or [] if t not in WINNERS]
    if kind != "tpu" or unknown:
        console.print(f"not a TPU target: {args.target}" if kind != "tpu" else
                      f"no TPU template winner for {', '.join(unknown)}; known: {', '.join(WINNERS)}")
        return 2

    from jaxbench.evaluate import EvalConfig, Evaluator
    from jaxbench.pool import WorkerPool

    rows: list[dict[str, Any]] = []
    with Evaluator(pool=WorkerPool(1), config=EvalConfig(correctness_seeds=args.seeds, unseen_size=True,
                                                                   timeout_s=args.timeout_s)) as ev:
        for task_id in args.tasks or list(WINNERS):
            row = _row(task_id, args.target, ev)
            rows.append(row)
            console.print(f"{row['task']} {row['template']} {row['status']} {row['unseen'] or row.get('reason', '')[:200]} "
                          f"({row['s']} s)")
            if args.json:
                args.json.write_text(json.dumps(rows, indent=1))

    table = Table(title=f"unseen-size check of the Pallas winners on {args.target}")
    for column in ("task", "template", "params", "checked at", "status", "unseen size and verdict", "s"):
        table.add_column(column)
    for row in rows:
        params = ", ".join(f"{k} {v}" for k, v in row["params"].items())
        verdict = row["unseen"] if row["unseen"] else row.get("reason", "")[:160]
        table.add_row(row["task"], row["template"], params, row.get("check", ""), row["status"], verdict, str(row["s"]))
    Console(width=260).print(table)
    passed = sum(r["passed"] for r in rows)
    print(f"passed the unseen size: {passed}/{len(rows)} Pallas winners on {args.target}")
    return 0 if passed == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
