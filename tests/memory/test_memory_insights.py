"""What the store says about strategies and parameters: measurements read back from a real event log
(SQLite + embedded Chroma), the nearest measured tasks, and each strategy's outcome there."""

from __future__ import annotations

import pytest

from jaxbench import load_task
from maxkernel.config import Settings
from maxkernel.messages import StrategyRef
from measured_sessions import record_session
from memory import Memory

ROWBLOCK = StrategyRef(name="template:rowblock", kind="template", params={"block_rows": 32},
                       space={"block_rows": [8, 16, 32, 64]}, extents={"block_rows": 64})
TAIL = StrategyRef(name="template:fused_tail", kind="template")
REF = StrategyRef(name="reference", kind="reference")


@pytest.fixture
def memory(local_settings: Settings, task_dir):
    with Memory.open(local_settings) as m:
        for name in ("t_gemm_gelu", "t_gemm_relu", "t_gemm_tanh_scale", "t_rmsnorm"):
            m.signature(load_task(task_dir(name)))  # traced once, then known to the store by id
        yield m


def test_measurements_flatten_drafts_and_tuning_trials(memory: Memory) -> None:
    record_session(memory.store, "t_gemm_relu", [ROWBLOCK, TAIL, REF],
                   {"template:rowblock": ("ok", 1.4), "template:fused_tail": ("compile_error", None)},
                   tuned={"template:rowblock": [({"block_rows": 64}, "ok", 1.9), ({"block_rows": 16}, "ok", 0.8)]})
    rows = memory.measurements("cpu")
    assert [(r.strategy, r.params, r.status, r.speedup, r.tuned) for r in rows] == [
        ("template:rowblock", {"block_rows": 32}, "ok", 1.4, False),
        ("template:rowblock", {"block_rows": 64}, "ok", 1.9, True),
        ("template:rowblock", {"block_rows": 16}, "ok", 0.8, True),
        ("template:fused_tail", {}, "compile_error", None, False),
    ]  # the tuner's tool reports (untuned parameters) are not counted twice
    tuned = rows[1]
    assert tuned.kind == "template" and tuned.extents == {"block_rows": 64}  # from the session's plan
    assert memory.measurements("tpu-v5e") == []
    assert memory.measured_count() == 5  # what retraining counts: every judge call (2 drafts, 2 trials) + 1 tuning report


def test_nearest_tasks_and_strategy_outcomes(memory: Memory, task_dir) -> None:
    record_session(memory.store, "t_gemm_relu", [ROWBLOCK, TAIL, REF],
                   {"template:rowblock": ("ok", 1.4), "template:fused_tail": ("compile_error", None),
                    "reference": ("ok", 1.0)})
    record_session(memory.store, "t_rmsnorm", [TAIL, ROWBLOCK, REF],
                   {"template:fused_tail": ("ok", 2.5), "template:rowblock": ("ok", 0.7)})
    # The nearest task of all, measured on another target only: it takes no place among the cpu matches.
    record_session(memory.store, "t_gemm_tanh_scale", [ROWBLOCK], {"template:rowblock": ("ok", 3.0)},
                   target="tpu-v5e")
    query = load_task(task_dir("t_gemm_gelu"))
    matches = memory.similar_tasks(query, k=5, target="cpu")
    assert [m.task_id for m in matches] == ["t_gemm_relu", "t_rmsnorm"]  # a matmul is nearer a matmul
    assert matches[0].score > matches[1].score

    outcomes = {(o.task_id, o.strategy): o for o in memory.strategy_outcomes(query, "cpu", k=5)}
    gemm_rowblock = outcomes[("t_gemm_relu", "template:rowblock")]
    assert gemm_rowblock.won and gemm_rowblock.best_speedup == 1.4 and gemm_rowblock.similarity == matches[0].score
    failed = outcomes[("t_gemm_relu", "template:fused_tail")]
    assert not failed.won and failed.passed == 0 and "does not divide" in failed.reason
    assert not outcomes[("t_gemm_relu", "reference")].won  # the reference wins nothing
    assert outcomes[("t_rmsnorm", "template:fused_tail")].won
    assert not outcomes[("t_rmsnorm", "template:rowblock")].won  # slower than the reference

    assert memory.similar_tasks(query, k=1, target="cpu")[0].task_id == "t_gemm_relu"
    assert [o.task_id for o in memory.strategy_outcomes(query, "tpu-v5e")] == ["t_gemm_tanh_scale"]
    assert memory.strategy_outcomes(query, "tpu-v4") == []


def test_a_strategy_the_session_measured_again_counts_by_what_held() -> None:
    """A lucky first reading (lower end 1.12) that the engine's confirmation runs put at par is no win there;
    a strategy never re-measured keeps its best reading, with that reading's upper end."""
    from memory.insights import Measurement, TaskMatch, strategy_outcomes

    def row(strategy: str, low: float, high: float, confirmation: bool = False) -> Measurement:
        return Measurement(task_id="t", target="cpu", strategy=strategy, kind="template", status="ok", correct=True,
                           speedup=low, speedup_high=high, confirmation=confirmation)

    rows = [row("template:rowblock", 1.12, 1.33), row("template:rowblock", 0.93, 1.02, confirmation=True),
            row("template:rowblock", 0.95, 1.01, confirmation=True),
            row("template:fused_tail", 0.97, 1.03), row("template:fused_tail", 0.90, 0.99)]
    by_name = {o.strategy: o for o in strategy_outcomes(rows, [TaskMatch(task_id="t", score=0.9)])}
    rowblock, tail = by_name["template:rowblock"], by_name["template:fused_tail"]
    assert (rowblock.best_speedup, rowblock.best_high) == (0.93, 1.02) and not rowblock.won
    assert (tail.best_speedup, tail.best_high) == (0.97, 1.03) and not tail.won
