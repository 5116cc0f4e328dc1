"""Algebraic rewrites: each removes the work it claims to, and the evaluator proves the result correct."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxbench import static_checks
from jaxbench.task import load_task
from maxkernel.analysis.program import trace_program
from maxkernel.rewrites import apply_rewrites, propose_rewrites, render_rewrite


def _dots(program):  # type: ignore[no-untyped-def]
    return [n for n in program.nodes if n.prim == "dot_general"]


@pytest.mark.slow
def test_sum_after_matmul_becomes_matrix_vector_product(quick_evaluator) -> None:  # type: ignore[no-untyped-def]
    task = load_task("21k_Gemm_Divide_Sum_Scaling")
    result = apply_rewrites(trace_program(task), ["sum_after_matmul"])
    (dot,) = _dots(result.program)
    assert [len(op.shape) for op in dot.ins] == [2, 1]  # [M, K] x [K]: no [M, N] product any more
    source = render_rewrite(task, ["sum_after_matmul"])
    assert static_checks.scan(source)[0] == []
    report = quick_evaluator.evaluate(task, source)
    assert report.passed, report.reason
    assert report.label == "jax"


@pytest.mark.slow
def test_size_one_reductions_and_idle_logsumexp_vanish(quick_evaluator) -> None:  # type: ignore[no-untyped-def]
    task = load_task("23k_Matmul_Sum_Max_AvgPool_LogSumExp_LogSumExp")
    combined = propose_rewrites(task)[0]
    prims = [n.prim for n in combined.program.nodes]
    assert {"size_one_reductions", "idle_subgraphs", "sum_after_matmul"} <= set(combined.names)
    assert "log" not in prims and "exp" not in prims and "reduce_max" not in prims
    report = quick_evaluator.evaluate(task, render_rewrite(task, combined.names))
    assert report.passed, report.reason


def test_idle_subgraphs_never_drop_an_epsilon() -> None:
    # rsqrt(ms + eps) differs from rsqrt(ms) only for tiny ms: the exact check on small draws must see it.
    result = apply_rewrites(trace_program(load_task("12p_RMSNorm")), ["idle_subgraphs"])
    assert not result.sites
    assert "add" in [n.prim for n in result.program.nodes]


def test_scalar_chain_folds_residual_into_one_multiply() -> None:
    from maxkernel.analysis.program import ProgramBuilder

    def scaled_residual(x, w, b):  # type: ignore[no-untyped-def]
        h = x @ w + b
        return h * 0.5 + h

    shapes = [jax.ShapeDtypeStruct(s, jnp.float32) for s in ((8, 16), (16, 32), (32,))]
    program = ProgramBuilder().build(jax.make_jaxpr(scaled_residual)(*shapes), ["x", "w", "b"])
    result = apply_rewrites(program, ["scalar_chains"])
    after_dot = [n.prim for n in result.program.nodes][-2:]
    assert after_dot == ["add", "mul"]  # h * 0.5 + h  ->  h * 1.5
    consts = [op for op in result.program.nodes[-1].ins if not hasattr(op, "name")]
    assert consts and abs(float(consts[0].scalar()) - 1.5) < 1e-6


def test_a_static_is_not_folded_into_a_constant() -> None:
    """``h * scaling_factor + h`` keeps its static: folded into ``h * 1.5`` it would be right for one value."""
    result = apply_rewrites(trace_program(load_task("30k_Matmul_Scaling_ResidualAdd")), ["scalar_chains"])
    assert not result.sites


def test_dead_code_in_any_task_folder(tmp_path: Path, quick_evaluator) -> None:  # type: ignore[no-untyped-def]
    folder = tmp_path / "dead_task"
    folder.mkdir()
    (folder / "task.yaml").write_text(
        "id: dead_task\nname: dead\ncategory: elementwise\ndescription: tanh with an unused exp\n"
        "dtype: float32\ntolerance: {atol: 1.0e-5, rtol: 1.0e-5}\n"
        "sizes:\n  cpu: {n: 512}\n  full: {n: 4096}\n")
    (folder / "reference.py").write_text(
        "import jax\nimport jax.numpy as jnp\n\n\ndef get_inputs(key, *, n):\n"
        "    return (jax.random.normal(key, (n, n), jnp.float32),), {}\n\n\n"
        "def reference(x):\n    unused = jnp.exp(x) @ x\n    return jnp.tanh(x)\n")
    task = load_task(folder)
    (dead,) = [r for r in propose_rewrites(task) if r.names == ["dead_code"]]
    assert dead.sites["dead_code"] >= 2 and not _dots(dead.program)
    report = quick_evaluator.evaluate(task, render_rewrite(task, ["dead_code"]))
    assert report.passed, report.reason


@pytest.mark.parametrize(("strides", "padding", "dilation"), [((1, 1), ((0, 0), (0, 0)), (1, 1)),
                                                              ((2, 1), ((1, 2), (0, 1)), (1, 1)),
                                                              ((1, 1), ((2, 2), (2, 2)), (2, 2))])
def test_conv_as_matmul_matches_the_convolution(strides, padding, dilation) -> None:  # type: ignore[no-untyped-def]
    from maxkernel.rewrites.conv_matmul import _patch_matmul

    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal((2, 3, 9, 7)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((5, 3, 3, 2)), jnp.float32)
    want = jax.lax.conv_general_dilated(x, w, strides, padding, lhs_dilation=dilation,
                                        precision=jax.lax.Precision.HIGHEST)
    got = jax.jit(_patch_matmul(padding, strides, dilation))(x, w)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_transposed_3d_conv_becomes_a_matmul_and_passes(quick_evaluator) -> None:  # type: ignore[no-untyped-def]
    task = load_task("28k_ConvTranspose3d_LayerNorm_GELU_Scaling")
    result = apply_rewrites(trace_program(task), ["conv_as_matmul"])
    prims = [n.prim for n in result.program.nodes]
    assert "conv_general_dilated" not in prims and "dot_general" in prims
    report = quick_evaluator.evaluate(task, render_rewrite(task, ["conv_as_matmul"]))
    assert report.passed, report.reason


def test_conv_as_matmul_leaves_wide_convolutions_alone() -> None:
    task = load_task("18k_Conv2D_ReLU_BiasAdd")  # 16 input channels: XLA's own convolution is faster there
    assert apply_rewrites(trace_program(task), ["conv_as_matmul"]).sites == {}
    narrow = load_task("25k_Conv3d_GroupNorm_Mean")  # 3 channels, but on TPU the MXU runs the conv itself
    assert [r.names for r in propose_rewrites(narrow, target="cpu")] == [["conv_as_matmul"]]
    assert propose_rewrites(narrow, target="tpu-v5e") == []


@pytest.mark.slow
def test_bf16_matmuls_widen_on_cpu_only(quick_evaluator) -> None:  # type: ignore[no-untyped-def]
    task = load_task("9p_SwiGLU_MLP")
    result = apply_rewrites(trace_program(task), ["widen_matmuls"])
    dots = _dots(result.program)
    assert len(dots) == 3 and all(str(op.dtype) == "float32" for d in dots for op in d.ins)
    report = quick_evaluator.evaluate(task, render_rewrite(task, ["widen_matmuls"]))
    assert report.passed, report.reason
    assert [r.names for r in propose_rewrites(task, target="cpu")] == [["widen_matmuls"]]
    assert propose_rewrites(task, target="tpu-v5e") == []


def test_average_pooling_after_a_matmul_folds_into_the_weights(quick_evaluator) -> None:  # type: ignore[no-untyped-def]
    task = load_task("49k_Matmul_AvgPool_GELU_Scale_Max")
    result = apply_rewrites(trace_program(task), ["pool_into_weights"])
    (dot,) = _dots(result.program)
    assert dot.out.shape == (512, 1024 // 16)  # 16 times fewer output features computed
    report = quick_evaluator.evaluate(task, render_rewrite(task, ["pool_into_weights"]))
    assert report.passed, report.reason


@pytest.mark.slow
def test_mish_is_recomputed_with_one_exp_and_stays_correct(quick_evaluator) -> None:  # type: ignore[no-untyped-def]
    task = load_task("27k_Matmul_Mish_Mish")
    result = apply_rewrites(trace_program(task), ["cheaper_activations"])
    prims = [n.prim for n in result.program.nodes]
    assert result.sites == {"cheaper_activations": 2}
    assert "tanh" not in prims and "log1p" not in prims and prims.count("exp") == 2
    report = quick_evaluator.evaluate(task, render_rewrite(task, ["cheaper_activations"]))
    assert report.passed, report.reason


def test_a_plain_tanh_is_not_mistaken_for_mish_and_gelu_uses_erf(quick_evaluator) -> None:  # type: ignore[no-untyped-def]
    task = load_task("47k_Matmul_Add_Swish_Tanh_GELU_Hardtanh")
    before = [n.prim for n in trace_program(task).nodes]
    after = [n.prim for n in apply_rewrites(trace_program(task), ["cheaper_activations"]).program.nodes]
    assert after.count("tanh") == before.count("tanh") == 1
    assert "erfc" in before and "erfc" not in after and "erf" in after
    report = quick_evaluator.evaluate(task, render_rewrite(task, ["cheaper_activations"]))
    assert report.passed, report.reason


@pytest.mark.slow
def test_independent_loop_iterations_are_batched_and_open_to_widening(quick_evaluator) -> None:  # type: ignore[no-untyped-def]
    task = load_task("7p_Ragged_Paged_Attention")
    result = apply_rewrites(trace_program(task), ["vectorize_maps", "widen_matmuls"])
    maps = [n for n in result.program.nodes if n.prim == "scan" and n.params["num_carry"] == 0]
    assert maps == [] and result.sites.get("widen_matmuls", 0) >= 1  # the loop body's bf16 matmul is reachable now
    report = quick_evaluator.evaluate(task, render_rewrite(task, result.names))
    assert report.passed, report.reason
