"""The TPU convolution template: implicit GEMM over halo'd slabs, correct in interpret mode, lowering for v6e."""

from __future__ import annotations

import types

import pytest

from jaxbench.task import load_task
from maxkernel.analysis import analyze_task
from maxkernel.rules.strategy import propose_strategies
from maxkernel.targets import validate_tpu
from maxkernel.templates.tpu_conv import TPU_CONV, conv_vmem_bytes, plan, step_shape


def _space_is_legal(task_id: str) -> dict[str, object]:
    """Every configuration of the v6e space tiles (8, 128) and fits the VMEM the kernel plans for."""
    task = load_task(task_id)
    space = TPU_CONV.space(task, analyze_task(task, "tpu-v6e"), "tpu-v6e")
    full = plan(task, ("full",))
    assert not isinstance(full, str)
    assert space.space["block_n"], space
    for bn in space.space["block_n"]:
        assert full.o % bn == 0 and (bn % 8 == 0 or bn == full.o)
        for bc in space.space["block_c"]:
            assert full.c % bc == 0 and (bc % 128 == 0 or bc == full.c)
            for bd in space.space["block_d"]:
                planes, rows, span = step_shape(full, bd)
                assert rows % 128 == 0 and span % 128 == 0 and span >= rows
                assert full.nd == 3 or planes % 8 == 0
                for passes in space.space["passes"]:
                    assert conv_vmem_bytes(full, bn, bc, bd, passes) <= 0.4 * 128 * 2**20
    return space.defaults


def test_2d_convolution_with_its_bias_relu_epilogue_fused_is_correct_and_lowers(declared_size_evaluator) -> None:  # type: ignore[no-untyped-def]
    task = load_task("18k_Conv2D_ReLU_BiasAdd")
    assert TPU_CONV.applies(task, analyze_task(task)) is None
    source = TPU_CONV.render(task, {"block_n": 32, "block_c": 16, "block_d": 32, "passes": 3}, ("cpu", "full"))
    # No convolution left to XLA and no im2col: the taps are shifted windows of one slab in VMEM.
    assert "conv_general_dilated" not in source and "shift:shift + rows" in source
    assert "jnp.bfloat16" in source and "Precision.HIGHEST" not in source
    assert "o_ref[...] = epilogue(" in source  # the bias and ReLU run on the accumulator
    report = declared_size_evaluator.evaluate(task, source)
    assert report.passed and report.label == "pallas-kernel", report.reason

    defaults = _space_is_legal(task.id)
    result = validate_tpu(TPU_CONV.render(task, defaults, ("cpu", "full")), task, "v6e")
    assert result.ok, result.reason
    assert result.vmem_bytes is not None and result.vmem_bytes <= result.vmem_budget_bytes


def test_3d_convolution_at_full_precision_is_correct_and_lowers(declared_size_evaluator) -> None:  # type: ignore[no-untyped-def]
    task = load_task("33k_Conv3d_Mish_Tanh")
    source = TPU_CONV.render(task, {"block_n": 16, "block_c": 8, "block_d": 2, "passes": 6}, ("cpu", "full"))
    assert "Precision.HIGHEST" in source and "conv_general_dilated" not in source
    report = declared_size_evaluator.evaluate(task, source)
    assert report.passed and report.label == "pallas-kernel", report.reason

    defaults = _space_is_legal(task.id)
    result = validate_tpu(TPU_CONV.render(task, defaults, ("cpu", "full")), task, "v6e")
    assert result.ok, result.reason


def test_an_epilogue_that_reduces_over_positions_runs_in_xla_on_the_output() -> None:
    task = load_task("25k_Conv3d_GroupNorm_Mean")  # group norm, then a mean over channels and positions
    full = plan(task, ("full",))
    assert not isinstance(full, str) and not full.tileable
    source = TPU_CONV.render(task, _space_is_legal(task.id), ("cpu", "full"))
    assert "return epilogue(h, conv_bias, gamma, beta)" in source and "epilogue=None" in source


def test_an_epilogue_that_divides_by_a_square_image_is_written_per_extent() -> None:
    task = load_task("39k_Conv2d_GELU_GlobalAvgPool")  # the mean over H x W, and H == W at every size
    full = plan(task, ("cpu", "full"))
    assert not isinstance(full, str)
    # Written once, it would divide by the height twice: wrong wherever a check size halves the height only.
    assert () not in full.epilogues and len(full.epilogues) == 2
    source = TPU_CONV.render(task, _space_is_legal(task.id), ("cpu", "full"))
    module = types.ModuleType("candidate")
    exec(compile(source, "candidate.py", "exec"), module.__dict__)
    with pytest.raises(ValueError, match="written for extents"):
        module._epilogue_for((full.o, 127, 254))


def test_a_transposed_convolution_is_the_convolution_of_the_dilated_input() -> None:
    task = load_task("28k_ConvTranspose3d_LayerNorm_GELU_Scaling")
    cpu = plan(task, ("cpu",))
    assert not isinstance(cpu, str)
    assert cpu.pads == ((2, 2, 1),) * 3 and cpu.rhs is not None  # stride 2 as interior padding; the flipped kernel
    source = TPU_CONV.render(task, {"block_n": 16, "block_c": 8, "block_d": 4, "passes": 3}, ("cpu",))
    assert "def _conv_weight(weight)" in source and "jax.lax.pad(x" in source


def test_the_template_is_offered_on_tpu_targets_only() -> None:
    task = load_task("46k_Conv2d_GroupNorm_Tanh_HardSwish_ResidualAdd_LogSumExp")
    on_tpu = [s.name for s in propose_strategies(task, analyze_task(task, "tpu-v6e"), "tpu-v6e")]
    on_cpu = [s.name for s in propose_strategies(task, analyze_task(task), "cpu")]
    assert "template:tpu_conv" in on_tpu and "template:tpu_conv" not in on_cpu
