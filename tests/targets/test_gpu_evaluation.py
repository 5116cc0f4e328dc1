"""The GPU branch of evaluate_candidate, and the GPU flash-attention template on the suite's task."""

from __future__ import annotations

import pytest
from gpu_kernels import triton_matmul_source

from jaxbench.task import Task, load_task
from maxkernel.analysis import analyze_task
from maxkernel.evaluation import evaluate_candidate
from maxkernel.rules.strategy import propose_strategies, render
from maxkernel.targets.gpu_lowering import plugin_available, validate_gpu
from maxkernel.targets.gpu_model import model_gpu_candidate, model_gpu_reference
from maxkernel.targets.names import TargetError

needs_plugin = pytest.mark.skipif(not plugin_available(), reason='needs the CUDA plugin: pip install -e ".[gpu]"')


@needs_plugin
def test_block_shape_triton_rejects_is_compile_error_with_its_message(matmul_task: Task) -> None:
    report = evaluate_candidate(matmul_task, triton_matmul_source(48, 64, 32), target="gpu-h100")
    assert report.status == "compile_error"
    assert "power of 2" in report.reason
    assert report.checks[0].name == "gpu_lowering_h100" and not report.checks[0].passed


def test_bare_gpu_is_refused_in_one_line_without_a_gpu(matmul_task: Task) -> None:
    with pytest.raises(TargetError, match="has none"):
        evaluate_candidate(matmul_task, triton_matmul_source(64, 64, 32), target="gpu")


@needs_plugin
def test_flash_template_is_proposed_lowers_and_is_modelled_faster() -> None:
    task = load_task("1p_Flash_Attention")
    strategies = propose_strategies(task, analyze_task(task), "gpu-h100")
    (flash,) = [s for s in strategies if s.name == "template:gpu_flash_attention"]
    source = render(task, flash)
    assert "plt.CompilerParams(num_warps=" in source and "interpret" not in source
    for chip in ("h100", "a100"):
        lowered = validate_gpu(source, task, chip)
        assert lowered.ok, lowered.reason
    ours, ref = model_gpu_candidate(source, task, "h100"), model_gpu_reference(task, "h100")
    assert ours.time_ms < ref.time_ms
    # Causal: the loop stops at the diagonal, so about half the dense attention's dot work is modelled.
    dense = 4 * 2 * 32 * 4096 * 4096 * 128
    assert 0.5 * dense <= ours.dot_flops < 0.6 * dense


@needs_plugin
def test_rowblock_template_lowers_through_triton_and_refuses_non_power_of_two_rows(rmsnorm_task: Task) -> None:
    from maxkernel.templates.gpu_rowblock import GPU_ROWBLOCK

    analysis = analyze_task(rmsnorm_task)
    assert GPU_ROWBLOCK.applies(rmsnorm_task, analysis) is None
    space = GPU_ROWBLOCK.space(rmsnorm_task, analysis, "gpu-a100")
    source = GPU_ROWBLOCK.render(rmsnorm_task, space.defaults, ("cpu", "full"))
    lowered = validate_gpu(source, rmsnorm_task, "a100")
    assert lowered.ok and lowered.backends == ["triton"], lowered.reason
    cross_entropy = load_task("13p_Cross_Entropy")
    assert "power-of-two" in (GPU_ROWBLOCK.applies(cross_entropy, analyze_task(cross_entropy)) or "")
