"""benchmarks/cost_model_holdout.py: the learned and the hand-written order compared on held-out tasks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from maxkernel.analysis.signature import TaskSignature, TensorSpec
from memory.insights import Measurement
from support import load_benchmark

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "cost_model_holdout.py"
BLOCKS = [8, 16, 32, 64, 128, 256]


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_benchmark("cost_model_holdout")


def measured(task: str, rows: int) -> list[Measurement]:
    """Every block of one strategy on one task; 64-row blocks run fastest, which the hand order (fewest grid
    steps first) does not know, so a model that learned it from other tasks ranks them better."""
    out = []
    for i, block in enumerate([128, *[b for b in BLOCKS if b != 128]]):
        speedup = 2.0 / (1.0 + abs((block.bit_length() - 1) - 6) * 0.3)
        out.append(Measurement(task_id=task, session_id=f"s-{task}", target="cpu", strategy="template:rowblock",
                               kind="template", params={"block_rows": block}, extents={"block_rows": rows},
                               space={"block_rows": BLOCKS}, status="ok", correct=True, speedup=speedup, tuned=i > 0))
    return out


def signature(task: str, rows: int) -> TaskSignature:
    spec = TensorSpec(shape=[rows, 512], dtype="float32")
    return TaskSignature(task_id=task, category="normalization", primitives=["reduce_sum", "rsqrt", "mul"],
                         inputs=[spec], outputs=[spec])


def test_the_learned_order_is_compared_on_tasks_it_did_not_see(bench: ModuleType) -> None:
    tasks = {f"t{i}": 256 * (i + 1) for i in range(6)}
    rows = [m for task, n in tasks.items() for m in measured(task, n)]
    groups = bench.compare(rows, {t: signature(t, n) for t, n in tasks.items()}, folds=3, min_configs=3, target="cpu")
    assert {g.task for g in groups} == set(tasks)  # every task held out once
    for g in groups:
        assert g.configs == len(BLOCKS) and g.best == pytest.approx(2.0)
        assert g.hand_to_best >= 2  # the draft (128) stays first; the hand order then tries 256 before 64
    summary = bench.summary(groups)
    assert summary["learned_to_best_mean"] < summary["hand_to_best_mean"]
    assert summary["learned_regret2_mean"] < summary["hand_regret2_mean"]
    assert summary["learned_sooner"] > summary["hand_sooner"]


def test_a_missing_data_folder_is_one_line(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(BENCH), "--data", str(tmp_path / "nowhere")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"error: --data: no such folder: {tmp_path / 'nowhere'}"]
