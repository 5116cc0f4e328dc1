"""The TPU row-block template: the fused reference on blocks of rows, one body for every size."""

from __future__ import annotations

import pytest
import types


from jaxbench.task import load_task
from maxkernel.analysis import analyze_task
from maxkernel.targets import validate_tpu
from maxkernel.templates.tpu_rows import TPU_ROWS


@pytest.mark.slow
def test_rmsnorm_rows_are_correct_and_lower_with_one_body_for_every_row_width(declared_size_evaluator) -> None:  # type: ignore[no-untyped-def]
    task = load_task("12p_RMSNorm")  # three axes, two of them rows; the mean divides by the row width
    assert TPU_ROWS.applies(task, analyze_task(task)) is None
    source = TPU_ROWS.render(task, {"block_rows": 512}, ("cpu", "full"))
    module = types.ModuleType("candidate")
    exec(compile(source, "candidate.py", "exec"), module.__dict__)
    # The body divides by the row width it reads from its block, so one body serves every width.
    assert "hidden = x.shape[2]" in source and "/ hidden" in source
    assert module._reference_for(((2048,), (2048,))) is module._reference_for(((8192,), (8192,))) is module._reference
    assert module._reference_for(((4096,), (4096,))) is module._reference
    report = declared_size_evaluator.evaluate(task, source)
    assert report.passed and report.label == "pallas-kernel", report.reason

    space = TPU_ROWS.space(task, analyze_task(task, "tpu-v6e"), "tpu-v6e")
    assert space.space["block_rows"] and all(r % 8 == 0 for r in space.space["block_rows"])
    result = validate_tpu(TPU_ROWS.render(task, space.defaults, ("cpu", "full")), task, "v6e")
    assert result.ok, result.reason
    assert result.vmem_bytes is not None and result.vmem_bytes <= result.vmem_budget_bytes


def test_rows_coupled_by_batch_statistics_or_holding_a_matmul_are_refused() -> None:
    coupled = load_task("31k_Gemm_BatchNorm_GELU_ReLU")
    assert "depend on other rows" in str(TPU_ROWS.applies(coupled, analyze_task(coupled)))
    gemm = load_task("41k_Gemm_Add_ReLU")
    assert "matmul" in str(TPU_ROWS.applies(gemm, analyze_task(gemm)))
