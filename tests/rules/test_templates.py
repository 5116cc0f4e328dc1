"""Pallas templates: real kernels that are correct on CPU and lower for TPU at full size."""

from __future__ import annotations

from collections.abc import Iterator

import jax
import numpy as np
import pytest

from jaxbench import static_checks
from jaxbench.task import load_task
from maxkernel.analysis import analyze_task
from maxkernel.analysis.program import trace_program
from maxkernel.targets import validate_tpu
from maxkernel.templates.matmul import MATMUL
from maxkernel.templates.rowblock import ROWBLOCK
from support import task_folder, task_yaml


def test_rowblock_rmsnorm_is_a_correct_multi_step_pallas_kernel(quick_evaluator) -> None:  # type: ignore[no-untyped-def]
    task = load_task("12p_RMSNorm")
    analysis = analyze_task(task)
    assert ROWBLOCK.applies(task, analysis) is None
    space = ROWBLOCK.space(task, analysis, "cpu")
    assert 2048 in space.space["block_rows"] and space.defaults["block_rows"] == 4096
    source = ROWBLOCK.render(task, {"block_rows": 2048}, ("cpu",))
    assert "BLOCK_ROWS = 2048" in source and "grid=(pl.cdiv(rows, block_rows),)" in source and "interpret" not in source
    assert "4096" not in source and "1024" not in source  # no traced row count or sequence length is written in
    _correct_here_and_at_the_unseen_size(quick_evaluator.evaluate(task, source))


def _correct_here_and_at_the_unseen_size(report) -> None:  # type: ignore[no-untyped-def]
    """Shapes read from the arguments: right at the declared size and at the size the evaluator drew."""
    assert report.label == "pallas-kernel"
    assert report.status == "ok", report.reason
    check = report.check("correct_unseen_size")
    assert check is not None and check.passed and check.detail.startswith("unseen size "), check


def _load(source: str) -> dict:  # type: ignore[type-arg]
    namespace: dict = {}  # type: ignore[type-arg]
    exec(compile(source, "<candidate>", "exec"), namespace)
    return namespace


def _at(task_id: str, values: dict) -> tuple:  # type: ignore[type-arg]
    """Inputs and the reference's answer at a size of the task's own choosing."""
    task = load_task(task_id)
    sized = task.with_size("probe", {**task.size("cpu"), **values})
    args, static = sized.get_inputs(jax.random.key(3), "probe")
    return args, static, np.asarray(sized.reference(*args, **static))


@pytest.fixture
def plain_interpret() -> Iterator[None]:
    """Pallas' plain interpreter for an in-process run, switched off again after the test: a process-wide
    interpret mode left on would make later TPU lowering tests lower interpreted kernels."""
    from jaxbench.interpret import force_interpret

    force_interpret("plain")
    yield
    force_interpret("none")


@pytest.mark.parametrize("task_id, block, values", [
    ("13p_Cross_Entropy", 48, {"tokens": 101}),  # three whole blocks and a partial one
    ("12p_RMSNorm", 96, {"batch": 1, "seq": 200}),  # 2 whole blocks and 8 rows
])
def test_rowblock_partial_last_block_is_right(task_id: str, block: int, values: dict, plain_interpret: None) -> None:  # type: ignore[type-arg]
    task = load_task(task_id)
    kernel = _load(ROWBLOCK.render(task, {"block_rows": block}, ("cpu",)))["kernel"]
    args, static, expected = _at(task_id, values)
    out = np.asarray(jax.jit(lambda *a: kernel(*a, **static))(*args))
    np.testing.assert_allclose(out, expected, atol=1e-4, rtol=1e-5)


def test_rowblock_refuses_a_row_shape_it_was_not_written_for(plain_interpret: None) -> None:
    task = load_task("13p_Cross_Entropy")  # the reference's index arithmetic writes the vocabulary in
    kernel = _load(ROWBLOCK.render(task, {"block_rows": 192}, ("cpu",)))["kernel"]
    args, static, _ = _at("13p_Cross_Entropy", {"tokens": 16, "vocab": 1000})
    with pytest.raises(ValueError, match=r"written for row shapes \[\(\(32768,\), \(\)\), .* not \(\(1000,\), \(\)\)"):
        kernel(*args, **static)


def test_matmul_template_k_loop_accumulates_and_fuses_the_epilogue(quick_evaluator) -> None:  # type: ignore[no-untyped-def]
    task = load_task("41k_Gemm_Add_ReLU")
    assert MATMUL.applies(task, analyze_task(task)) is None
    source = MATMUL.render(task, {"block_m": 256, "block_n": 512, "block_k": 1024}, ("cpu",))
    assert "BLOCK_M = 256" in source and "BLOCK_K = 1024" in source and "pltpu.VMEM((bm, bn), jnp.float32)" in source
    assert "jnp.maximum" in source  # the ReLU comes from the reference's own epilogue
    assert static_checks.scan(source)[0] == []
    _correct_here_and_at_the_unseen_size(quick_evaluator.evaluate(task, source))


def test_matmul_partial_tiles_and_a_k_the_block_does_not_divide_are_right(plain_interpret: None) -> None:
    task = load_task("41k_Gemm_Add_ReLU")
    kernel = _load(MATMUL.render(task, {"block_m": 64, "block_n": 48, "block_k": 64}, ("cpu",)))["kernel"]
    # 100 rows: one partial M tile; 72 columns: one partial N tile; K=96 is not a multiple of 64: one K step.
    args, static, expected = _at("41k_Gemm_Add_ReLU", {"batch": 100, "in_features": 96, "out_features": 72})
    out = np.asarray(jax.jit(lambda *a: kernel(*a, **static))(*args))
    np.testing.assert_allclose(out, expected, atol=1e-4, rtol=1e-5)


def test_templates_lower_for_tpu_at_full_size() -> None:
    for task_id, template in (("12p_RMSNorm", ROWBLOCK), ("41k_Gemm_Add_ReLU", MATMUL)):
        task = load_task(task_id)
        space = template.space(task, analyze_task(task, "tpu-v5e"), "tpu-v5e")
        result = validate_tpu(template.render(task, space.defaults, ("cpu", "full")), task, "v5e")
        assert result.ok, result.reason
        assert result.vmem_bytes <= result.vmem_budget_bytes


def test_tpu_spaces_respect_alignment_and_vmem() -> None:
    task = load_task("41k_Gemm_Add_ReLU")
    analysis = analyze_task(task, "tpu-v5e")
    # The whole [8192, 8192] weight cannot sit in VMEM: no row-block configuration is legal on TPU.
    assert ROWBLOCK.space(task, analysis, "tpu-v5e").space["block_rows"] == []
    space = MATMUL.space(task, analysis, "tpu-v5e").space
    assert all(b % 8 == 0 for b in space["block_m"])
    assert all(b % 128 == 0 for b in space["block_n"] + space["block_k"])


def test_matmul_template_refuses_what_it_cannot_fuse() -> None:
    task = load_task("21k_Gemm_Divide_Sum_Scaling")  # a row sum in the epilogue: not elementwise
    assert "reduce_sum" in (MATMUL.applies(task, analyze_task(task)) or "")


def test_flash_attention_gqa_causal_blocks_are_correct_and_lower(declared_size_evaluator) -> None:  # type: ignore[no-untyped-def]
    from maxkernel.templates.attention import FLASH_ATTENTION, analyse

    task = load_task("2p_GQA_Attention")
    shape = analyse(task, "cpu")
    assert not isinstance(shape, str)
    assert shape.group == 4 and abs(shape.scale - 0.125) < 1e-9
    # Three query blocks by six key blocks at the cpu size: rows of one to six visible blocks.
    source = FLASH_ATTENTION.render(task, {"block_q": 256, "block_k": 128}, ("cpu",))
    assert "BLOCK_Q = 256" in source and "BLOCK_K = 128" in source
    assert "pl.BlockSpec((None, group, block_q, head_dim)" in source  # the q block holds the whole group
    assert '("parallel", "parallel", "arbitrary")' in source
    assert "Precision.HIGHEST" not in source and "jnp.inf" not in source  # bf16 operands, finite mask
    report = declared_size_evaluator.evaluate(task, source)
    assert report.passed and report.label == "pallas-kernel", report.reason
    tpu = FLASH_ATTENTION.space(task, analyze_task(task, "tpu-v5e"), "tpu-v5e")
    result = validate_tpu(FLASH_ATTENTION.render(task, tpu.defaults, ("cpu", "full")), task, "v5e")
    assert result.ok, result.reason


def test_flash_attention_block_sparse_mask_is_correct_across_blocks(declared_size_evaluator) -> None:  # type: ignore[no-untyped-def]
    from maxkernel.templates.attention import FLASH_ATTENTION

    task = load_task("4p_Sparse_Attention")  # kernel blocks of 128 span two of the task's 64-key blocks
    assert FLASH_ATTENTION.applies(task, analyze_task(task)) is None
    source = FLASH_ATTENTION.render(task, {"block_q": 128, "block_k": 256}, ("cpu", "full"))
    assert "def kernel(q, k, v, *, block_size, window_blocks, global_blocks):" in source
    report = declared_size_evaluator.evaluate(task, source)
    assert report.passed and report.label == "pallas-kernel", report.reason
    result = validate_tpu(FLASH_ATTENTION.render(task, {"block_q": 512, "block_k": 512}, ("cpu", "full")), task, "v6e")
    assert result.ok, result.reason


def test_flex_attention_bias_tiles_reproduce_the_dense_bias_and_the_kernel_is_correct(declared_size_evaluator) -> None:  # type: ignore[no-untyped-def]
    import types

    import numpy as np

    from maxkernel.templates.attention import FLASH_ATTENTION

    task = load_task("5p_Flex_Attention")
    space = FLASH_ATTENTION.space(task, analyze_task(task), "cpu")
    assert list(space.space) == ["block_q"]  # a blocked bias needs square blocks
    source = FLASH_ATTENTION.render(task, {"block_q": 128}, ("cpu",))
    module = types.ModuleType("candidate")
    exec(compile(source, "candidate.py", "exec"), module.__dict__)
    table = np.random.default_rng(0).standard_normal((2, 300)).astype(np.float32)
    tiles, far = module._bias_tiles(table, 128)
    rows, cols = np.arange(768)[:, None], np.arange(768)[None, :]
    dense = table[:, np.clip(rows - cols, 0, 299)]
    for i in range(6):
        for j in range(6):
            tile = tiles[:, min(max(i - j, -1), far) + 1]
            assert np.array_equal(tile, dense[:, i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]), (i, j)
    report = declared_size_evaluator.evaluate(task, source)  # six by six blocks: every distance's tile is used
    assert report.passed and report.label == "pallas-kernel", report.reason
    tpu = FLASH_ATTENTION.space(task, analyze_task(task, "tpu-v5e"), "tpu-v5e")
    result = validate_tpu(FLASH_ATTENTION.render(task, tpu.defaults, ("cpu", "full")), task, "v5e")
    assert result.ok, result.reason


@pytest.mark.parametrize("task_id", ["31k_Gemm_BatchNorm_GELU_ReLU", "38k_Matmul_Dropout_Softmax", "22k_Conv2d_InstanceNorm_Divide"])
@pytest.mark.slow
def test_fused_tail_kernel_covers_batch_statistics_dropout_and_convs(task_id: str, quick_evaluator) -> None:  # type: ignore[no-untyped-def]
    from maxkernel.templates.epilogue import FUSED_TAIL

    task = load_task(task_id)
    assert FUSED_TAIL.applies(task, analyze_task(task, "cpu")) is None
    source = FUSED_TAIL.render(task, {}, ("cpu",))
    assert "pl.pallas_call(" in source and "interpret" not in source
    assert source.count("def _fused") == 1 and "_two_d_shape(r.shape)" in source  # one kernel for every shape
    report = quick_evaluator.evaluate(task, source)
    assert report.label == "pallas-kernel"
    assert report.check("correct_inputs_seed_0").passed
    # 31k's batch mean divides by the batch dimension it summed (not the traced count), so it holds there too.
    assert report.passed and report.check("correct_unseen_size").passed, report.reason


def test_fused_tail_refuses_programs_without_a_heavy_op_and_big_tpu_tails() -> None:
    from maxkernel.templates.epilogue import FUSED_TAIL, split_tail

    assert split_tail(trace_program(load_task("12p_RMSNorm")).dce()) == "no matmul or convolution to fuse after"
    task = load_task("41k_Gemm_Add_ReLU")  # a 1024 x 8192 f32 tail at full size cannot sit in VMEM whole
    assert FUSED_TAIL.space(task, analyze_task(task, "cpu"), "tpu-v5e").space == {"whole": []}


GELU_PROJECTION = '''\
import jax
import jax.numpy as jnp


def get_inputs(key, *, tokens, d_in, d_out):
    k1, k2 = jax.random.split(key)
    x = jax.random.normal(k1, (tokens, d_in), jnp.float32)
    return (x, jax.random.normal(k2, (d_in, d_out), jnp.float32) / d_in ** 0.5), {}


def reference(x, w):
    return jax.nn.gelu(x @ w, approximate=False)
'''


def test_an_exact_gelu_epilogue_lowers_for_tpu(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Exact GELU is erfc, which Mosaic does not lower: the epilogue is written with 1 - erf instead."""
    task = task_folder(tmp_path, "gelu_erf", task_yaml("gelu_erf", "matmul", 0.01, {"tokens": 256, "d_in": 512, "d_out": 512},
                                                       {"tokens": 4096, "d_in": 2048, "d_out": 2048}, "tokens"),
                       GELU_PROJECTION)
    space = MATMUL.space(task, analyze_task(task, "tpu-v6e"), "tpu-v6e")
    source = MATMUL.render(task, space.defaults, ("cpu", "full"))
    assert "erfc" not in source and "erf(" in source
    result = validate_tpu(source, task, "v6e")
    assert result.ok, result.reason
