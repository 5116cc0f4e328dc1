"""TPU templates for references with more than one matmul: each correct in interpret mode at a small size
with two or more steps on every grid axis, and lowering for tpu-v6e at its default blocks."""

from __future__ import annotations

from jaxbench.task import load_task
from maxkernel.analysis import analyze_task
from maxkernel.rules.strategy import propose_strategies
from maxkernel.targets import validate_tpu
from maxkernel.templates.tpu_mlp import TPU_MLP, mlp_vmem_bytes, plan


def _lowers_at_defaults(template, task) -> dict:  # type: ignore[no-untyped-def]
    space = template.space(task, analyze_task(task, "tpu-v6e"), "tpu-v6e")
    result = validate_tpu(template.render(task, space.defaults, ("cpu", "full")), task, "v6e")
    assert result.ok, result.reason
    assert result.vmem_bytes is not None and result.vmem_bytes <= result.vmem_budget_bytes
    return space.space


def test_swiglu_keeps_the_hidden_activation_in_vmem(declared_size_evaluator) -> None:  # type: ignore[no-untyped-def]
    task = load_task("9p_SwiGLU_MLP")
    assert TPU_MLP.applies(task, analyze_task(task)) is None
    # cpu size: 128 tokens, intermediate 2048: 2 row blocks by 4 hidden blocks.
    source = TPU_MLP.render(task, {"block_m": 64, "block_h": 512, "passes": 1}, ("cpu", "full"))
    assert "_activation(_product(x, w_gate_ref[...]), _product(x, w_up_ref[...]))" in source
    assert "_product(hidden, w_down_ref[...])" in source
    assert "Precision.HIGHEST" not in source and "_split" not in source  # bf16 operands as they are
    report = declared_size_evaluator.evaluate(task, source)
    assert report.passed and report.label == "pallas-kernel", report.reason
    space = _lowers_at_defaults(TPU_MLP, task)
    assert space["passes"] == [1]


def test_two_layer_mlp_reduced_per_row_in_three_bf16_passes(declared_size_evaluator) -> None:  # type: ignore[no-untyped-def]
    task = load_task("32k_Gemm_Sigmoid_LogSumExp")  # x @ w1.T, bias, sigmoid, @ w2.T, bias, logsumexp per row
    full = plan(task, ("full",))
    assert not isinstance(full, str) and full.w_nk and not full.tileable
    source = TPU_MLP.render(task, {"block_m": 256, "block_h": 512, "passes": 3}, ("cpu", "full"))
    assert "_split" in source and "jnp.max(second" in source
    report = declared_size_evaluator.evaluate(task, source)
    assert report.passed and report.label == "pallas-kernel", report.reason
    space = _lowers_at_defaults(TPU_MLP, task)
    assert space["passes"] == [3, 6]
    for bm in space["block_m"]:
        for bh in space["block_h"]:
            assert full.m % bm == 0 and full.hidden % bh == 0 and bm % 8 == 0 and bh % 128 == 0
            assert mlp_vmem_bytes(full, bm, bh, 3) <= 0.75 * 128 * 2**20


def test_the_chain_template_refuses_what_it_does_not_compute() -> None:
    assert "1 matmuls" in str(plan(load_task("8p_GEMM"), ("cpu",)))
    task = load_task("9p_SwiGLU_MLP")
    on_tpu = [s.name for s in propose_strategies(task, analyze_task(task, "tpu-v6e"), "tpu-v6e")]
    on_cpu = [s.name for s in propose_strategies(task, analyze_task(task), "cpu")]
    assert "template:tpu_mlp" in on_tpu and "template:tpu_mlp" not in on_cpu
