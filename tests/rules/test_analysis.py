"""Analysis: op graph, patterns, cost and bound, row structure."""

from __future__ import annotations

import pytest
from jaxbench.task import load_task
from maxkernel.analysis import analyze_task


@pytest.mark.slow
def test_matmul_then_reduction_is_compute_bound_on_cpu() -> None:
    a = analyze_task(load_task("21k_Gemm_Divide_Sum_Scaling"), "cpu")
    assert "matmul_then_reduction" in a.patterns
    (mm,) = [op for op in a.ops if op.kind == "matmul"]
    assert mm.prologue == ["transpose"] and mm.epilogue == ["div", "reduce_sum"]
    assert a.flops > 1e9 and a.bound == "compute"
    assert a.rows is not None and a.rows.independent


@pytest.mark.slow
def test_rmsnorm_is_memory_bound_on_tpu_and_row_independent() -> None:
    a = analyze_task(load_task("12p_RMSNorm"), "tpu-v5e")
    assert "rmsnorm" in a.patterns and a.bound == "memory"
    assert a.rows is not None and a.rows.rows == 4096 and a.rows.independent
    assert "op graph" in a.summary() and "memory-bound" in a.summary()


@pytest.mark.slow
def test_batch_statistics_couple_rows_and_attention_is_recognised() -> None:
    assert not analyze_task(load_task("43k_Gemm_BatchNorm_Scaling_Softmax")).rows.independent  # type: ignore[union-attr]
    a = analyze_task(load_task("1p_Flash_Attention"))
    assert {"attention", "softmax"} <= set(a.patterns)
