"""The TPU GEMM template: bf16 MXU passes, the epilogue fused or over whole rows, one body for every size."""

from __future__ import annotations

import types

import pytest

from jaxbench.task import load_task
from maxkernel.analysis import analyze_task
from maxkernel.rules.strategy import propose_strategies
from maxkernel.targets import validate_tpu
from maxkernel.templates.tpu_gemm import GEMM_VMEM_SHARE, TPU_GEMM, gemm_vmem_bytes, plan

SMALL = {"block_m": 256, "block_n": 512, "block_k": 512}  # two or more steps on every grid axis at cpu size


def _module(source: str) -> types.ModuleType:
    module = types.ModuleType("candidate")
    exec(compile(source, "candidate.py", "exec"), module.__dict__)
    return module


@pytest.mark.slow
def test_row_epilogue_in_three_bf16_passes_is_correct_and_lowers(declared_size_evaluator) -> None:  # type: ignore[no-untyped-def]
    task = load_task("50k_Matmul_GELU_Softmax")  # softmax over the features: the epilogue needs whole rows
    assert TPU_GEMM.applies(task, analyze_task(task)) is None
    source = TPU_GEMM.render(task, {**SMALL, "passes": 3, "block_rows": 64}, ("cpu", "full"))
    assert "_rows_kernel" in source and "Precision.HIGHEST" not in source and "jnp.bfloat16" in source
    assert "erfc" not in source  # exact GELU's erfc has no Mosaic lowering: written as 1 - erf
    report = declared_size_evaluator.evaluate(task, source)
    assert report.passed and report.label == "pallas-kernel", report.reason

    analysis = analyze_task(task, "tpu-v6e")
    space = TPU_GEMM.space(task, analysis, "tpu-v6e")
    full = plan(task, ("full",))
    assert not isinstance(full, str)
    assert space.space["passes"] == [3, 6]
    for bm in space.space["block_m"]:
        for bn in space.space["block_n"]:
            for bk in space.space["block_k"]:
                assert full.m % bm == 0 and full.n % bn == 0 and full.k % bk == 0
                assert bm % 8 == 0 and bn % 128 == 0 and bk % 128 == 0
                assert gemm_vmem_bytes(full, bm, bn, bk, 3) <= GEMM_VMEM_SHARE * 128 * 2**20
    result = validate_tpu(TPU_GEMM.render(task, space.defaults, ("cpu", "full")), task, "v6e")
    assert result.ok, result.reason
    assert result.vmem_bytes is not None and result.vmem_bytes <= result.vmem_budget_bytes
    assert result.vmem_budget_bytes <= 128 * 2**20  # the raised limit stays within the chip's VMEM


def test_elementwise_epilogue_is_fused_into_the_gemm_at_full_precision(declared_size_evaluator) -> None:  # type: ignore[no-untyped-def]
    task = load_task("41k_Gemm_Add_ReLU")
    source = TPU_GEMM.render(task, {**SMALL, "passes": 6}, ("cpu", "full"))
    assert "_rows_kernel" not in source and "Precision.HIGHEST" in source
    report = declared_size_evaluator.evaluate(task, source)
    assert report.passed and report.label == "pallas-kernel", report.reason


def test_an_epilogue_whose_constants_follow_the_row_width_is_written_per_width() -> None:
    task = load_task("29k_Matmul_Swish_Sum_GroupNorm")  # group norm: divides by the group's width
    source = TPU_GEMM.render(task, {"block_m": 512, "block_n": 1024, "block_k": 512, "passes": 3, "block_rows": 64},
                             ("cpu", "full"))
    module = _module(source)
    assert module._epilogue_for((1024, 64)) is module._epilogue_1024x64  # (row width, num_groups)
    assert module._epilogue_for((4096, 64)) is module._epilogue_4096x64
    with pytest.raises(ValueError, match="written for extents"):
        module._epilogue_for((4096, 32))  # another group count: its reshape differs


@pytest.mark.slow
def test_dropout_draws_are_made_whole_in_xla_and_the_softmax_runs_on_row_blocks(declared_size_evaluator) -> None:  # type: ignore[no-untyped-def]
    """38k: random bits drawn per row block would not be the reference's draws, so the draws (bits, uniform,
    keep mask) run in XLA over the whole product, the mask travels as int8, and the rest of the tail (the
    dropout's select, the softmax) runs in the row-block kernel instead of XLA."""
    task = load_task("38k_Matmul_Dropout_Softmax")
    full = plan(task, ("full",))
    assert not isinstance(full, str) and full.placement == "rows" and full.prologue is not None
    assert not any(n.prim.startswith("random") for n in full.tail.nodes)
    assert any(n.prim.startswith("random") for n in full.prologue.program.nodes)
    assert [str(v.dtype) for v in full.prologue.outputs] == ["int8"] and full.row_blocked[-1]
    space = TPU_GEMM.space(task, analyze_task(task, "tpu-v6e"), "tpu-v6e")
    assert all(r % 32 == 0 for r in space.space["block_rows"])  # int8 blocks tile by 32 rows
    source = TPU_GEMM.render(task, {**SMALL, "passes": 3, "block_rows": 64}, ("cpu", "full"))
    assert "= _prologue(" in source and "random" not in source.split("def _prologue")[0]
    report = declared_size_evaluator.evaluate(task, source)  # the same mask as the reference, or it fails
    assert report.passed and report.label == "pallas-kernel", report.reason
    result = validate_tpu(TPU_GEMM.render(task, space.defaults, ("cpu", "full")), task, "v6e")
    assert result.ok, result.reason


def test_statistics_over_the_batch_run_in_xla_on_the_product_with_one_epilogue_for_every_extent() -> None:
    task = load_task("31k_Gemm_BatchNorm_GELU_ReLU")  # batch norm: a mean over the rows, divided by the batch
    assert TPU_GEMM.applies(task, analyze_task(task)) is None
    source = TPU_GEMM.render(task, {"block_m": 512, "block_n": 1024, "block_k": 512, "passes": 3}, ("cpu", "full"))
    assert "_rows_kernel" not in source and "return epilogue(h" in source
    module = _module(source)
    full = plan(task, ("full",))
    assert not isinstance(full, str) and full.placement == "xla"
    cpu = plan(task, ("cpu",))
    assert not isinstance(cpu, str) and (cpu.m, cpu.n) != (full.m, full.n)
    # The emitted epilogue divides by the batch it reads from its input, so one function serves both sizes.
    assert "h_dim0 = h.shape[0]" in source and "/ h_dim0" in source
    assert module._epilogue_for((full.m, full.n)) is module._epilogue_for((cpu.m, cpu.n)) is module._epilogue


def test_the_template_is_offered_on_tpu_targets_only() -> None:
    task = load_task("41k_Gemm_Add_ReLU")
    on_tpu = [s.name for s in propose_strategies(task, analyze_task(task, "tpu-v6e"), "tpu-v6e")]
    on_cpu = [s.name for s in propose_strategies(task, analyze_task(task), "cpu")]
    assert "template:tpu_gemm" in on_tpu and "template:tpu_gemm" not in on_cpu


def test_an_incorrect_three_pass_gemm_near_the_tolerance_is_retried_at_highest() -> None:
    """21k and 23k: three passes missed atol 1e-3 on one element; the debugger's fix is the HIGHEST product."""
    from jaxbench.report import EvalReport
    from maxkernel.rules.fixes import fix_known_error

    task = load_task("21k_Gemm_Divide_Sum_Scaling")
    params = {**TPU_GEMM.space(task, analyze_task(task, "tpu-v6e"), "tpu-v6e").defaults, "block_rows": 64}
    assert params["passes"] == 3
    three = TPU_GEMM.render(task, params, ("cpu", "full"))
    missed = EvalReport(task=task.id, target="tpu-v6e", status="incorrect", max_abs_err=0.0044)
    fixed = fix_known_error(three, missed)
    assert fixed == TPU_GEMM.render(task, {**params, "passes": 6}, ("cpu", "full"))
    assert "Precision.HIGHEST" in fixed and "_split" not in fixed
    assert fix_known_error(three, missed.model_copy(update={"max_abs_err": 5.0})) is None  # a wrong kernel
    assert fix_known_error(three, missed.model_copy(update={"status": "ok", "correct": True})) is None
    assert fix_known_error(fixed, missed) is None  # already at HIGHEST: nothing left to try


def test_batch_statistics_in_xla_leave_the_batch_free_for_the_check() -> None:
    """31k: the batch-norm epilogue divides by the rows it reads, so the check runs fewer rows than `full`
    (at batch 16384 the check would need 2.8e11 reference FLOPs and be refused)."""
    from maxkernel.targets.check_size import CHECK_FLOPS, derive_check_size
    from maxkernel.targets.loader import load_candidate
    from maxkernel.targets.specs import load_tpu_spec

    task = load_task("31k_Gemm_BatchNorm_GELU_ReLU")
    space = TPU_GEMM.space(task, analyze_task(task, "tpu-v6e"), "tpu-v6e")
    source = TPU_GEMM.render(task, space.defaults, ("cpu", "full"))
    check = derive_check_size(load_candidate(source), task, load_tpu_spec("v6e"), interpreted=True)
    assert check.refusal is None, check.refusal
    assert check.values["batch"] < task.size("full")["batch"]
    assert check.reference_flops is not None and check.reference_flops <= CHECK_FLOPS


def test_a_product_summed_over_its_columns_is_left_to_the_pre_summed_weight_rewrite() -> None:
    """21k and 23k: after pre-summing the weight the work is a matvec; a GEMM would do N times more."""
    for task_id in ("21k_Gemm_Divide_Sum_Scaling", "23k_Matmul_Sum_Max_AvgPool_LogSumExp_LogSumExp"):
        task = load_task(task_id)
        assert "sum_after_matmul" in str(TPU_GEMM.applies(task, analyze_task(task)))
        names = [s.name for s in propose_strategies(task, analyze_task(task, "tpu-v6e"), "tpu-v6e")]
        assert "template:tpu_gemm" not in names and any("sum_after_matmul" in n for n in names)
    kept = load_task("36k_Matmul_Sigmoid_Sum")  # a sum after a nonlinearity: the GEMM is needed
    assert TPU_GEMM.applies(kept, analyze_task(kept)) is None


ROUTER = '''\
import jax
import jax.numpy as jnp


def get_inputs(key, *, tokens, hidden):
    k1, k2 = jax.random.split(key)
    return (jax.random.normal(k1, (tokens, hidden), jnp.float32),
            jax.random.normal(k2, (hidden, 64), jnp.float32) / hidden ** 0.5), {}


def reference(x, w):
    probs = jax.nn.softmax(jnp.dot(x, w, precision=jax.lax.Precision.HIGHEST), axis=-1)
    top, idx = jax.lax.top_k(probs, 4)
    top = top / jnp.sum(top, axis=-1, keepdims=True)
    return jnp.zeros_like(probs).at[jnp.arange(probs.shape[0])[:, None], idx].set(top)
'''


def _router(tmp_path, free: str):  # type: ignore[no-untyped-def]
    folder = tmp_path / "router"
    folder.mkdir()
    (folder / "task.yaml").write_text(
        "id: router\nname: router\ncategory: moe\ndescription: a router.\ndtype: float32\n"
        "tolerance: {atol: 1.0e-3, rtol: 1.0e-3}\nsizes:\n  cpu: {tokens: 256, hidden: 512}\n"
        f"  full: {{tokens: 8192, hidden: 4096}}\n{free}")
    (folder / "reference.py").write_text(ROUTER)
    return load_task(folder)


def test_a_top_k_after_the_matmul_runs_in_xla_not_in_the_kernel(tmp_path) -> None:  # type: ignore[no-untyped-def]
    task = _router(tmp_path, "")  # the token count fixed: the tail is written for the sizes it runs at
    full = plan(task, ("full",))
    assert not isinstance(full, str) and full.placement == "xla"  # its rows are independent, but no kernel holds top_k
    source = TPU_GEMM.render(task, {"block_m": 512, "block_n": 64, "block_k": 512, "passes": 3}, ("cpu", "full"))
    assert "_rows_kernel" not in source
    result = validate_tpu(source, task, "v6e")
    assert result.ok, result.reason
    offered = [s.name for s in propose_strategies(task, analyze_task(task, "tpu-v6e"), "tpu-v6e")]
    assert "template:rowblock" not in offered  # its row body would hold the top-k: no Mosaic lowering
    assert "template:rowblock" in [s.name for s in propose_strategies(task, analyze_task(task, "cpu"), "cpu")]


def test_a_tail_written_for_each_token_count_is_refused_when_the_tokens_are_free(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # The scatter's row indices are an iota over the tokens, written with their count: such a kernel could
    # not run at a batch of tokens it was not written for, which the evaluator draws.
    task = _router(tmp_path, "free: {tokens: {}}\n")
    assert TPU_GEMM.applies(task, analyze_task(task, "tpu-v6e")) == (
        "the computation after the matmul is written for each row count (its text follows the batch), "
        "so it could not run at a batch it was not written for")


# Activations kept feature-major ([features, tokens], as a caller that stores them transposed hands them
# over), multiplied by a weight stored [out, in] through einsum; a bias and a tanh GELU after.
FEATURE_MAJOR = '''\
import jax
import jax.numpy as jnp


def get_inputs(key, *, tokens, width):
    k1, k2, k3 = jax.random.split(key, 3)
    acts = jax.random.normal(k1, (width, tokens), jnp.float32)
    proj = jax.random.normal(k2, (512, width), jnp.float32) / width ** 0.5
    shift = jax.random.normal(k3, (512,), jnp.float32)
    return (proj, acts, shift), {}


def reference(proj, acts, shift):
    y = jnp.einsum("dt,ed->te", acts, proj, precision=jax.lax.Precision.HIGHEST)
    return jax.nn.gelu(y + shift)
'''

# The same, written with the transpose spelled out (``acts.T @ proj.T``), and a near miss that reads the
# activations again after the product (a residual of their own transpose: x is not only the matmul's).
TRANSPOSES = FEATURE_MAJOR.replace('jnp.einsum("dt,ed->te", acts, proj, precision=jax.lax.Precision.HIGHEST)',
                                   "jnp.matmul(acts.T, proj.T, precision=jax.lax.Precision.HIGHEST)")
READ_AGAIN = TRANSPOSES.replace("(512, width)", "(width, width)").replace("(512,)", "(width,)").replace(
    "return jax.nn.gelu(y + shift)", "return jax.nn.gelu(y + shift) + acts.T")


def _feature_major(tmp_path, name: str, source: str):  # type: ignore[no-untyped-def]
    from support import task_folder, task_yaml

    return task_folder(tmp_path, name, task_yaml(name, "matmul", 0.001, {"tokens": 256, "width": 512},
                                                 {"tokens": 2048, "width": 4096}, "tokens"), source)


@pytest.mark.parametrize("name", ["einsum", "transposes"])
def test_activations_stored_feature_major_are_read_in_their_layout(tmp_path, declared_size_evaluator,  # type: ignore[no-untyped-def]
                                                                   name: str) -> None:
    task = _feature_major(tmp_path, name, {"einsum": FEATURE_MAJOR, "transposes": TRANSPOSES}[name])
    full = plan(task, ("full",))
    assert not isinstance(full, str), full
    assert full.x_km and full.w_nk and full.x.name == "acts" and full.w.name == "proj"
    assert (full.m, full.n, full.k) == (2048, 512, 4096)
    offered = [s.name for s in propose_strategies(task, analyze_task(task, "tpu-v6e"), "tpu-v6e")]
    assert "template:tpu_gemm" in offered
    source = TPU_GEMM.render(task, {"block_m": 128, "block_n": 256, "block_k": 256, "passes": 3}, ("cpu", "full"))
    assert "k, m = acts.shape" in source and "pl.BlockSpec((block_k, block_m), lambda i, j, kk: (kk, i))" in source
    assert ".T" not in source.partition("def kernel")[2]  # no transpose of the activations in HBM
    report = declared_size_evaluator.evaluate(task, source)
    assert report.passed and report.label == "pallas-kernel", report.reason
    result = validate_tpu(source, task, "v6e")
    assert result.ok, result.reason


def test_activations_read_again_after_the_product_are_not_a_gemm_input(tmp_path) -> None:  # type: ignore[no-untyped-def]
    task = _feature_major(tmp_path, "read_again", READ_AGAIN)
    assert plan(task, ("cpu",)) == "the computation after the matmul reads x or the weight again"
