"""The evaluator's unseen size: a kernel fixed to the shapes it was traced at is incorrect, with the size named."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest

from jaxbench.task import SUITE_DIR, FreeSize, TaskError, _draw_value, list_tasks, load_task

SMALL_RMSNORM = """\
id: small_rmsnorm
name: small_rmsnorm
category: normalization
description: RMSNorm over the last axis at a size small enough for a test.
dtype: float32
tolerance: {atol: 1.0e-5, rtol: 1.0e-5}
sizes:
  cpu: {batch: 2, seq: 64, hidden: 128}
  full: {batch: 4, seq: 128, hidden: 256}
free: {batch: {}, seq: {multiple_of: 16}}
"""

GENERIC = """\
import jax
import jax.numpy as jnp


def kernel(x, weight, *, eps):
    mean_square = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
    return x * jax.lax.rsqrt(mean_square + eps) * weight
"""

TRACED_SHAPES = """\
import jax
import jax.numpy as jnp


def kernel(x, weight, *, eps):
    mean_square = jnp.mean(jnp.square(x), axis=-1).reshape(2, 64, 1)
    return x * jax.lax.rsqrt(mean_square + eps) * weight
"""

# Right shape everywhere, right values only at the size it was written for.
TRACED_VALUES = """\
import jax
import jax.numpy as jnp


def kernel(x, weight, *, eps):
    mean_square = jnp.sum(jnp.square(x), axis=-1, keepdims=True) / (2 * 64 * 128) * (x.shape[0] * x.shape[1])
    return x * jax.lax.rsqrt(mean_square + eps) * weight
"""


@pytest.fixture()
def small_task(tmp_path: Path):
    folder = tmp_path / "small_rmsnorm"
    folder.mkdir()
    shutil.copy(SUITE_DIR / "12p_RMSNorm" / "reference.py", folder / "reference.py")
    (folder / "task.yaml").write_text(SMALL_RMSNORM)
    return load_task(folder)


def test_a_shape_generic_kernel_passes_the_unseen_size(quick_evaluator, small_task):
    report = quick_evaluator.evaluate(small_task, GENERIC)
    assert report.status == "ok", report.reason
    check = report.check("correct_unseen_size")
    assert check is not None and check.passed and "unseen size batch=" in check.detail


@pytest.mark.parametrize("source", [TRACED_SHAPES, TRACED_VALUES], ids=["shapes", "values"])
def test_a_kernel_fixed_to_its_traced_size_is_incorrect_with_the_size_named(quick_evaluator, small_task, source):
    report = quick_evaluator.evaluate(small_task, source)
    assert report.check("correct_inputs_seed_0").passed  # right at the declared size
    assert report.status == "incorrect"
    assert report.reason.startswith("unseen size batch=") and "seq=" in report.reason
    assert not report.check("correct_unseen_size").passed


def test_drawn_values_leave_the_base_stay_on_the_grid_and_within_bounds():
    rng = random.Random(0)
    for current, free in [(1, FreeSize()), (512, FreeSize()), (1024, FreeSize(multiple_of=128)),
                          (12, FreeSize(max=12)), (196, FreeSize(multiple_of=4, min=32))]:
        for _ in range(20):
            value = _draw_value(current, free, rng)
            assert value != current and value % free.multiple_of == 0 and value >= free.min
            assert free.max is None or value <= free.max
            assert value <= max(current, free.min) + 2 * free.multiple_of
            assert value < current or current // 2 < max(free.min, free.multiple_of)  # below the base where it can be
    assert all(_draw_value(512, FreeSize(), rng) % 8 for _ in range(20))  # blocks tuned at 512 do not tile it


def test_a_free_size_that_is_not_a_size_parameter_is_refused(tmp_path):
    folder = tmp_path / "bad"
    folder.mkdir()
    shutil.copy(SUITE_DIR / "12p_RMSNorm" / "reference.py", folder / "reference.py")
    (folder / "task.yaml").write_text(SMALL_RMSNORM.replace("seq: {multiple_of: 16}", "tokens: {}"))
    with pytest.raises(TaskError, match="free size 'tokens' is not a parameter"):
        load_task(folder)


def test_every_suite_task_declares_free_sizes():
    undeclared = [task.id for task in list_tasks() if not task.spec.free]
    assert undeclared == []


# One block of rows at the declared size (batch * seq = 128 rows), one row a block at any other, each
# block written by four steps: correct everywhere, but its steps grow with the rows at any other size.
STEPS_EXPLODE = """\
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _rows(x_ref, w_ref, o_ref, *, eps):
    x = x_ref[...]
    o_ref[...] = x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + eps) * w_ref[...]


def kernel(x, weight, *, eps):
    rows, hidden = x.shape[0] * x.shape[1], x.shape[2]
    block = rows if rows == 128 else 1
    out = pl.pallas_call(
        lambda x_ref, w_ref, o_ref: _rows(x_ref, w_ref, o_ref, eps=eps),
        out_shape=jax.ShapeDtypeStruct((rows, hidden), x.dtype),
        grid=(rows // block, 4),
        in_specs=[pl.BlockSpec((block, hidden), lambda i, j: (i, 0)), pl.BlockSpec((1, hidden), lambda i, j: (0, 0))],
        out_specs=pl.BlockSpec((block, hidden), lambda i, j: (i, 0)),
    )(x.reshape(rows, hidden), weight.reshape(1, hidden))
    return out.reshape(x.shape)
"""


def test_an_unseen_run_over_its_grid_step_bound_is_not_run_and_is_rejected(quick_evaluator, small_task):
    report = quick_evaluator.evaluate(small_task, STEPS_EXPLODE)
    assert report.check("correct_inputs_seed_0").passed  # right at the declared size, in one step
    assert report.status == "rejected", report.reason
    assert "unseen size batch=" in report.reason and "grid steps (limit 64)" in report.reason
    assert "against 4 at size 'cpu'" in report.reason
    assert not report.check("correct_unseen_size").passed


def test_coarser_draws_keep_parameters_below_their_step_and_stay_unseen():
    from jaxbench.evaluate import unseen_draws, unseen_step_limit

    task = load_task("2p_GQA_Attention")  # cpu: batch=1, seq=768; both free on a grid of 1
    for seed in range(10):
        draws = unseen_draws(task, "cpu", random.Random(seed))
        first, *coarser = draws
        assert first["seq"] != 768 and len(draws) == 3
        for grid, values in zip((8, 128), coarser):
            assert values["batch"] == first["batch"]  # batch=1 is below every coarse step: its first draw stays
            assert values["seq"] % grid == 0 and values["seq"] != 768
            assert values["seq"] <= 768 + 2 * grid
    # The bound follows the drawn size: three times the batch may take three times the steps.
    assert unseen_step_limit(100, task, "cpu", {"batch": 3, "seq": 768}) == 1200
    assert unseen_step_limit(100, task, "cpu", {"batch": 1, "seq": 500}) == 400
    assert unseen_step_limit(1, task, "cpu", {"batch": 1, "seq": 500}) == 64


def test_a_draw_over_the_bound_is_drawn_again_on_a_coarser_grid_and_named(quick_evaluator, tmp_path):
    folder = tmp_path / "rows_of_eight"
    folder.mkdir()
    shutil.copy(SUITE_DIR / "12p_RMSNorm" / "reference.py", folder / "reference.py")
    (folder / "task.yaml").write_text(SMALL_RMSNORM.replace("cpu: {batch: 2, seq: 64, hidden: 128}",
                                                            "cpu: {batch: 16, seq: 8, hidden: 128}")
                                      .replace("free: {batch: {}, seq: {multiple_of: 16}}", "free: {batch: {}}"))
    task = load_task(folder)
    # One step when the batch is a multiple of 8, one row a step otherwise: the first draw (never a
    # multiple of 8) is over the bound, the draw on multiples of 8 runs in one step.
    source = STEPS_EXPLODE.replace("block = rows if rows == 128 else 1", "block = rows if x.shape[0] % 8 == 0 else 1")
    report = quick_evaluator.evaluate(task, source)
    assert report.status == "ok", report.reason
    check = report.check("correct_unseen_size")
    assert check.passed and "(drawn again: unseen size batch=" in check.detail, check.detail
    ran = int(check.detail.removeprefix("unseen size batch=").split(",")[0].split(" ")[0])
    assert ran % 8 == 0 and ran != 16 and "grid steps (limit 64)" in check.detail


def _small_copy(tmp_path: Path, task_id: str, cpu: str) -> "object":
    """A suite task in a folder of its own, its ``cpu`` size replaced by a smaller one (same free sizes)."""
    import re

    folder = tmp_path / task_id
    shutil.copytree(SUITE_DIR / task_id, folder)
    spec = (folder / "task.yaml").read_text()
    (folder / "task.yaml").write_text(re.sub(r"  cpu: \{[^}]*\}", "  cpu: {" + cpu + "}", spec))
    return load_task(folder)


@pytest.mark.parametrize(("task_id", "cpu"), [
    ("2p_GQA_Attention", "batch: 1, q_heads: 2, kv_heads: 1, seq: 128, head_dim: 32"),  # no mask: padding alone masks
    ("5p_Flex_Attention", "batch: 1, heads: 1, seq: 128, head_dim: 32, num_buckets: 32"),  # square blocks, a bias tile
], ids=["gqa", "bias"])
@pytest.mark.slow
def test_flash_attention_serves_a_sequence_its_blocks_do_not_divide(quick_evaluator, tmp_path, task_id, cpu):
    from maxkernel.templates.attention import FLASH_ATTENTION

    task = _small_copy(tmp_path, task_id, cpu)
    source = FLASH_ATTENTION.render(task, {"block_q": 64, "block_k": 64}, ("cpu",))
    report = quick_evaluator.evaluate(task, source)
    assert report.status == "ok", report.reason
    check = report.check("correct_unseen_size")
    seq = int(check.detail.split("seq=")[1].split()[0].rstrip(","))
    assert check.passed and seq % 64 and "drawn again" not in check.detail, check.detail  # a partial last block ran


def test_the_gpu_matmul_masks_a_partial_tile_at_an_unseen_batch(quick_evaluator, tmp_path):
    from maxkernel.analysis import analyze_task
    from maxkernel.rules.strategy import propose_strategies, render

    task = _small_copy(tmp_path, "41k_Gemm_Add_ReLU", "batch: 64, in_features: 64, out_features: 32")
    (strategy,) = [s for s in propose_strategies(task, analyze_task(task), "gpu-h100")
                   if s.name == "template:gpu_matmul_epilogue"]
    source = render(task, strategy, {"block_m": 32, "block_n": 32, "block_k": 16})
    assert "plt.store(o_ref, out, mask=row_ok & col_ok)" in source
    report = quick_evaluator.evaluate(task, source)
    assert report.status == "ok", report.reason
    check = report.check("correct_unseen_size")
    assert check.passed and int(check.detail.split("batch=")[1].split()[0]) % 32, check.detail  # a partial tile ran


def test_a_pallas_modules_masked_load_is_not_file_access_but_numpys_load_is():
    from jaxbench.static_checks import scan

    source = ("from jax.experimental.pallas import triton as plt\nimport numpy as np\n\n\ndef kernel(x_ref):\n"
              "    return plt.load(x_ref, mask=None), np.load('expected.npy')\n")
    findings, _ = scan(source)
    assert [(f.rule, f.line, f.detail) for f in findings] == [("file-access", 6, "use of np.load (reads or writes files)")]


# Exact float32 at the declared batch; at any other, the matmul at default precision, which a TPU computes
# on bfloat16 operands (an f32 machine computes it exactly).
PRECISE_AT_ITS_BATCH_ONLY = """\
import jax
import jax.numpy as jnp


def kernel(x, weight, bias):
    precision = jax.lax.Precision.HIGHEST if x.shape[0] == 64 else None
    return jnp.maximum(jnp.matmul(x, weight.T, precision=precision) + bias, 0.0)
"""


def test_on_a_tpu_target_the_unseen_size_runs_interpreted_with_the_tpus_matmul_numerics(quick_evaluator, tmp_path):
    task = _small_copy(tmp_path, "41k_Gemm_Add_ReLU", "batch: 64, in_features: 256, out_features: 32")
    here = quick_evaluator.evaluate(task, PRECISE_AT_ITS_BATCH_ONLY)  # cpu: exact f32 at every size
    assert here.status == "ok" and here.check("correct_unseen_size").passed, here.reason
    # As the TPU path runs it at its check size: TPU interpret mode, the mode a tpu target gets here.
    tpu = quick_evaluator.evaluate(task, PRECISE_AT_ITS_BATCH_ONLY, target="tpu-v6e")
    assert tpu.check("correct_inputs_seed_0").passed  # HIGHEST at the declared size: exact on a TPU too
    assert tpu.status == "incorrect" and tpu.reason.startswith("unseen size batch="), tpu.reason


@pytest.mark.parametrize(("task_id", "cpu", "params"), [
    # A group norm after the matmul runs in XLA on the product; its text follows the group count, not the batch.
    ("40k_Gemm_GroupNorm_Min_BiasAdd", "batch: 64, in_features: 128, out_features: 256, num_groups: 8",
     {"block_m": 32, "block_n": 128, "block_k": 128, "passes": 3}),
    # A logsumexp per row: the row-block kernel after the GEMM, its last block of rows partial.
    ("24k_Matmul_Scale_ResidualAdd_Clamp_LogSumExp_Mish", "batch: 64, input_size: 128, hidden_size: 256",
     {"block_m": 32, "block_n": 128, "block_k": 128, "passes": 3, "block_rows": 16}),
], ids=["xla_tail", "row_tail"])
@pytest.mark.slow
def test_the_tpu_gemm_serves_an_unseen_batch_in_partial_blocks(quick_evaluator, tmp_path, task_id, cpu, params):
    from maxkernel.templates.base import sizes_for
    from maxkernel.templates.tpu_gemm import TPU_GEMM

    task = _small_copy(tmp_path, task_id, cpu)
    source = TPU_GEMM.render(task, params, sizes_for("tpu-v6e"))
    assert "pl.cdiv(m, block_m)" in source
    report = quick_evaluator.evaluate(task, source, target="tpu-v6e")  # TPU interpret mode and numerics
    assert report.status == "ok", report.reason
    check = report.check("correct_unseen_size")
    batch = int(check.detail.split("batch=")[1].split()[0])
    assert check.passed and batch % 16 and "drawn again" not in check.detail, check.detail


def test_the_fused_tail_of_a_chunked_scan_serves_other_sequence_lengths(quick_evaluator, tmp_path):
    # 16p's head splits seq into seq // 128 chunks of 128 and its heads into groups that equal the batch:
    # traced beside the probe size, the chunk count and the groups are read as what they follow.
    from maxkernel.templates.epilogue import FUSED_TAIL

    task = _small_copy(tmp_path, "16p_Mamba2_SSD", "batch: 2, seq: 256, heads: 4, head_dim: 32, groups: 2, state_dim: 16")
    source = FUSED_TAIL.render(task, {}, ("cpu",))
    assert "// 128" in source and source.count("def _head") == 1
    report = quick_evaluator.evaluate(task, source)
    assert report.status == "ok", report.reason
    assert report.check("correct_unseen_size").passed
