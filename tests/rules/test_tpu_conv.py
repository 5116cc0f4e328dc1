"""The TPU convolution template: implicit GEMM over halo'd slabs, correct in interpret mode, lowering for v6e."""

from __future__ import annotations

import types

import numpy as np
import pytest

from jaxbench.task import load_task
from maxkernel.analysis import analyze_task
from maxkernel.rules.strategy import propose_strategies, render
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


@pytest.mark.slow
def test_3d_convolution_at_full_precision_is_correct_and_lowers(declared_size_evaluator) -> None:  # type: ignore[no-untyped-def]
    task = load_task("33k_Conv3d_Mish_Tanh")
    source = TPU_CONV.render(task, {"block_n": 16, "block_c": 8, "block_d": 2, "passes": 6}, ("cpu", "full"))
    assert "Precision.HIGHEST" in source and "conv_general_dilated" not in source
    report = declared_size_evaluator.evaluate(task, source)
    assert report.passed and report.label == "pallas-kernel", report.reason

    defaults = _space_is_legal(task.id)
    result = validate_tpu(TPU_CONV.render(task, defaults, ("cpu", "full")), task, "v6e")
    assert result.ok, result.reason


def _tail_and_finish(task_id: str) -> tuple[object, ...]:
    """The tail after the convolution and its split, as functions, with inputs drawn at the cpu size."""
    import jax
    import jax.numpy as jnp

    from maxkernel.analysis.program import trace_program
    from maxkernel.rewrites.emit import emit_function
    from maxkernel.templates.tpu_conv import match

    p = match(trace_program(load_task(task_id), "cpu").dce())
    assert not isinstance(p, str) and p.stats is not None
    names: dict[str, object] = {"jax": jax, "jnp": jnp}
    for program, name in ((p.tail, "tail"), (p.stats.prefix, "prefix"), (p.stats.finish, "finish")):
        exec(emit_function(program, name), names)
    h = jax.random.normal(jax.random.key(0), p.tail.inputs[0].shape, jnp.float32) + 0.5
    operands = {v.name: 1.0 + 0.3 * jax.random.normal(jax.random.key(i + 1), v.shape, jnp.float32)
                for i, v in enumerate(p.tail.inputs[1:])}
    return p, names, h, operands


@pytest.mark.parametrize("task_id", ["25k_Conv3d_GroupNorm_Mean",
                                     "46k_Conv2d_GroupNorm_Tanh_HardSwish_ResidualAdd_LogSumExp"])
@pytest.mark.slow
def test_a_group_norm_finishes_from_per_channel_sums_as_the_reference_does(task_id: str) -> None:
    import jax.numpy as jnp

    p, names, h, operands = _tail_and_finish(task_id)
    assert p.stats.replaced == 2  # the mean and the variance
    # Only the normalize and what follows read the output; no reduction of the output is left but the
    # reference's own last one (the mean over channels and positions, the logsumexp over channels).
    a_in = p.stats.finish.inputs[0]
    assert all(n.ins[0] is not a_in for n in p.stats.finish.nodes if n.prim == "reduce_sum")
    a = names["prefix"](h, *[operands[v.name] for v in p.stats.prefix.inputs[1:]])
    axes = tuple(range(2, a.ndim))
    sums, squares = jnp.sum(a, axis=axes, keepdims=True), jnp.sum(a * a, axis=axes, keepdims=True)
    counts = jnp.full(sums.shape, float(np.prod(a.shape[2:])), jnp.float32)
    got = names["finish"](a, sums, squares, counts, *[operands[v.name] for v in p.stats.finish.inputs[4:]])
    want = names["tail"](h, *[operands[v.name] for v in p.tail.inputs[1:]])
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-5, atol=2e-5)
    # The counts are an operand: the finish divides by them, not by a literal of the traced batch.
    wrong = names["finish"](a, sums, squares, 2 * counts, *[operands[v.name] for v in p.stats.finish.inputs[4:]])
    assert not np.allclose(np.asarray(wrong), np.asarray(want), rtol=1e-3, atol=1e-3)


def test_a_norm_over_positions_merged_into_one_axis_reads_the_sums_too() -> None:
    import jax
    import jax.numpy as jnp

    from maxkernel.analysis.program import ProgramBuilder
    from maxkernel.rewrites.emit import emit_function
    from maxkernel.templates.conv_stats import split

    def tail(h, b):  # type: ignore[no-untyped-def]
        a = jnp.tanh(h + b[None, :, None, None])
        flat = a.reshape(a.shape[0], a.shape[1], -1)  # an instance norm over the flattened positions
        m = flat.mean(axis=2, keepdims=True)
        v = jnp.mean((flat - m) ** 2, axis=2, keepdims=True)
        return ((flat - m) / jnp.sqrt(v + 1e-5)).reshape(a.shape)

    shapes = (jax.ShapeDtypeStruct((2, 8, 6, 10), jnp.float32), jax.ShapeDtypeStruct((8,), jnp.float32))
    found = split(ProgramBuilder().build(jax.make_jaxpr(tail)(*shapes), ["h", "b"]), 8, 2)
    assert found is not None and found.replaced == 2
    names: dict[str, object] = {"jax": jax, "jnp": jnp}
    exec(emit_function(found.prefix, "prefix"), names)
    exec(emit_function(found.finish, "finish"), names)
    h, b = jax.random.normal(jax.random.key(0), (2, 8, 6, 10)), 0.3 * jax.random.normal(jax.random.key(1), (8,))
    a = names["prefix"](h, b)
    sums, squares = a.sum(axis=(2, 3), keepdims=True), (a * a).sum(axis=(2, 3), keepdims=True)
    got = names["finish"](a, sums, squares, jnp.full(sums.shape, 60.0))
    np.testing.assert_allclose(np.asarray(got), np.asarray(tail(h, b)), rtol=1e-4, atol=1e-4)
    # A sum over part of the positions is no statistic of the kernel's blocks: nothing is split.
    partial = lambda h, b: jnp.sum(h + b[None, :, None, None], axis=3)  # noqa: E731
    assert split(ProgramBuilder().build(jax.make_jaxpr(partial)(*shapes), ["h", "b"]), 8, 2) is None


def test_an_instance_norm_finish_runs_at_a_batch_it_was_not_written_at() -> None:
    import jax.numpy as jnp

    task = load_task("22k_Conv2d_InstanceNorm_Divide")  # batch == out_channels at full size
    full = plan(task, ("cpu", "full"))
    assert not isinstance(full, str) and full.stats is not None and () in full.epilogues
    names: dict[str, object] = {"jax": __import__("jax"), "jnp": jnp}
    exec(full.epilogues[()], names)
    y = jnp.ones((4, full.o, 3, 5), jnp.float32)
    stats = jnp.ones((4, full.o, 1, 1), jnp.float32)
    # The mean is squeezed out of the statistics, not reshaped to extents read where batch == channels.
    # The statics stay arguments of the epilogue (the kernel passes on the values it is called with).
    got = names["_epilogue"](y, stats * 15.0, stats * 30.0, stats * 15.0, divide_by=2.0, eps=1e-5)
    assert got.shape == y.shape


@pytest.mark.slow
def test_a_batch_norm_is_fused_as_channel_sums_and_correct_in_interpret_mode(declared_size_evaluator) -> None:  # type: ignore[no-untyped-def]
    task = load_task("34k_Conv2d_Activation_BatchNorm")  # Mish, then statistics over batch and positions
    full = plan(task, ("full",))
    assert not isinstance(full, str) and not full.tileable and full.stats is not None and full.writes_output
    # Two channel blocks and 8-row steps over 30 output rows: the last step's two rows past the output are
    # computed but must stay out of the sums.
    source = TPU_CONV.render(task, {"block_n": 16, "block_c": 16, "block_d": 8, "passes": 3}, ("cpu", "full"))
    assert "s_ref[...] = _channel_sums(a)" in source and "epilogue=_prefix" in source
    assert "return epilogue(h, sums, squares, counts, gamma, beta)" in source
    report = declared_size_evaluator.evaluate(task, source)
    assert report.passed and report.label == "pallas-kernel", report.reason

    result = validate_tpu(TPU_CONV.render(task, _space_is_legal(task.id), ("cpu", "full")), task, "v6e")
    assert result.ok, result.reason


@pytest.mark.slow
def test_a_global_pool_needs_only_the_sums_and_writes_no_output() -> None:
    task = load_task("39k_Conv2d_GELU_GlobalAvgPool")
    full = plan(task, ("cpu", "full"))
    assert not isinstance(full, str) and full.stats is not None and not full.writes_output
    # The mean divides by the counts it is given: one finish for every extent, square images included.
    assert () in full.epilogues
    source = TPU_CONV.render(task, {"block_n": 32, "block_c": 8, "block_d": 8, "passes": 3}, ("cpu", "full"))
    assert "o_ref" not in source and "return epilogue(None, sums, squares, counts)" in source
    result = validate_tpu(TPU_CONV.render(task, _space_is_legal(task.id), ("cpu", "full")), task, "v6e")
    assert result.ok, result.reason


@pytest.mark.slow
def test_an_epilogue_that_reads_a_square_image_is_written_per_extent() -> None:
    task = load_task("28k_ConvTranspose3d_LayerNorm_GELU_Scaling")  # a layer norm over the width; H == W
    full = plan(task, ("cpu", "full"))
    assert not isinstance(full, str) and full.stats is None
    # Written once, it could read the height where the width is meant: wrong wherever a check size halves
    # one of them only.
    assert () not in full.epilogues and len(full.epilogues) == 2
    source = TPU_CONV.render(task, {"block_n": 64, "block_c": 32, "block_d": 2, "passes": 3}, ("cpu", "full"))
    module = types.ModuleType("candidate")
    exec(compile(source, "candidate.py", "exec"), module.__dict__)
    with pytest.raises(ValueError, match="written for extents"):
        module._epilogue_for((full.o, 32, 64, 62, 1, 2))


@pytest.mark.slow
def test_an_epilogue_keyed_by_a_batch_count_is_written_for_the_check_ladder_too(tmp_path) -> None:
    """28k with its batch merged into the channels: the reference reshapes by a ``batch_count`` static that
    follows the batch, so the epilogue is keyed by it. Written for cpu and full only, no check size below
    full would run the code priced there."""
    from jaxbench.variants import derive
    from maxkernel.targets.check_size import CHECK_FLOPS, derive_check_size
    from maxkernel.targets.loader import load_candidate
    from maxkernel.targets.specs import load_tpu_spec

    task = load_task(derive(load_task("28k_ConvTranspose3d_LayerNorm_GELU_Scaling"), "batch_removed", tmp_path))
    strategy = next(s for s in propose_strategies(task, analyze_task(task, "tpu-v6e"), "tpu-v6e")
                    if s.name == "template:tpu_conv")
    source = render(task, strategy)
    module = load_candidate(source)
    counts = {key[-3] for key in _epilogue_keys(module)}  # (output extents..., batch_count, padding, stride)
    assert {1, 2, 16, 32} <= counts  # cpu's 2, full's 32 and the ladder's rungs of the batch
    check = derive_check_size(module, task, load_tpu_spec("v6e"), interpreted=True)
    assert check.refusal is None, check.refusal
    assert check.values["batch"] < task.size("full")["batch"]
    assert check.reference_flops is not None and check.reference_flops <= CHECK_FLOPS


def _epilogue_keys(module: types.ModuleType) -> list[tuple[int, ...]]:
    """The extents each ``_epilogue_<extents>`` function of a rendered kernel is written for."""
    return [tuple(int(d) for d in name.removeprefix("_epilogue_").split("x"))
            for name in vars(module) if name.startswith("_epilogue_") and name != "_epilogue_for"]


@pytest.mark.slow
def test_a_transposed_convolution_runs_as_its_phases_convolution_and_is_correct(declared_size_evaluator) -> None:  # type: ignore[no-untyped-def]
    task = load_task("28k_ConvTranspose3d_LayerNorm_GELU_Scaling")
    cpu = plan(task, ("cpu",))
    assert not isinstance(cpu, str)
    assert cpu.pads == ((2, 2, 1),) * 3 and cpu.rhs is not None  # stride 2 as interior padding; the flipped kernel
    # The kernel convolves the undilated input (4 x 8 x 8, padded by one) with a 3 x 3 x 3 window and
    # 8 phases x 16 output channels, not the 7/8-zero dilated input with 4 x 4 x 4 taps.
    assert (cpu.o, cpu.taps, cpu.padded, cpu.out_spatial) == (128, (3, 3, 3), (6, 10, 10), (4, 8, 8))
    # The layer norm reduces over the width alone: each output plane's own values, so the kernel runs it on
    # the planes it writes, after putting its phases in place.
    assert cpu.stats is None and cpu.tile_tail
    source = TPU_CONV.render(task, {"block_n": 128, "block_c": 8, "block_d": 2, "passes": 3}, ("cpu",))
    assert "def _conv_weight(weight)" in source and "_phase_weight(w0, STRIDES, PAD_LOW)" in source
    assert "_depth_to_space(y, strides" in source and "epilogue=epilogue" in source and "return h\n" in source
    assert "conv_general_dilated" not in source and "lax.pad(x, jnp.zeros((), x.dtype), ((0, 0, 0), (0, 0, 0)) + ((2, 2, 1)" not in source
    report = declared_size_evaluator.evaluate(task, source)
    assert report.passed and report.label == "pallas-kernel", report.reason

    defaults = _space_is_legal(task.id)
    result = validate_tpu(TPU_CONV.render(task, defaults, ("cpu", "full")), task, "v6e")
    assert result.ok, result.reason


@pytest.mark.slow
def test_the_template_is_offered_on_tpu_targets_only() -> None:
    task = load_task("46k_Conv2d_GroupNorm_Tanh_HardSwish_ResidualAdd_LogSumExp")
    on_tpu = [s.name for s in propose_strategies(task, analyze_task(task, "tpu-v6e"), "tpu-v6e")]
    on_cpu = [s.name for s in propose_strategies(task, analyze_task(task), "cpu")]
    assert "template:tpu_conv" in on_tpu and "template:tpu_conv" not in on_cpu
