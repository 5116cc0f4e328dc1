"""Structural rewrites: grouped matmuls, routed experts, statically masked and paged attention skip real work,
stay correct on fresh inputs (group sizes, routings), and refuse what they do not recognise."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxbench import static_checks
from jaxbench.task import load_task
from maxkernel.analysis import analyze_task
from maxkernel.analysis.program import trace_program
from maxkernel.rewrites.blocked_attention import BLOCKED_ATTENTION, block_plan, match_attention
from maxkernel.rewrites.grouped import GROUPED_MATMUL, ROUTED_EXPERTS, match_grouped
from maxkernel.rewrites.paged import PAGED_DECODE, match_paged
from maxkernel.rules.strategy import propose_strategies


def _load(source: str) -> dict:  # type: ignore[type-arg]
    namespace: dict = {}  # type: ignore[type-arg]
    exec(compile(source, "<candidate>", "exec"), namespace)
    return namespace


@pytest.mark.parametrize("form", ["pairs", "loop"])
def test_grouped_matmul_handles_empty_unaligned_and_whole_groups(form: str) -> None:
    task = load_task("14p_Ragged_Dot")
    source = GROUPED_MATMUL.render(task, {"form": form, "tile": 32}, ("cpu",))
    assert static_checks.scan(source)[0] == []
    grouped = _load(source)["_grouped_matmul"]
    rng = np.random.default_rng(0)
    lhs = jnp.asarray(rng.standard_normal((100, 24)), jnp.float32)
    rhs = jnp.asarray(rng.standard_normal((5, 24, 8)), jnp.float32)
    for sizes in ([0, 37, 0, 1, 62], [100, 0, 0, 0, 0], [0, 0, 0, 0, 100], [20, 20, 20, 20, 20], [3, 97, 0, 0, 0]):
        gs = jnp.asarray(sizes, jnp.int32)
        want = jax.lax.ragged_dot(lhs, rhs, gs, precision=jax.lax.Precision.HIGHEST)
        got = jax.jit(grouped, static_argnums=3)(lhs, rhs, gs, 32)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


def test_grouped_matmul_recognises_both_reference_forms_and_nothing_else() -> None:
    for task_id in ("14p_Ragged_Dot", "11p_Megablox_GMM"):
        roles = match_grouped(trace_program(load_task(task_id)).dce())
        assert not isinstance(roles, str), roles
    assert isinstance(match_grouped(trace_program(load_task("8p_GEMM")).dce()), str)


@pytest.mark.slow
def test_grouped_and_routed_candidates_pass_the_evaluator(declared_size_evaluator) -> None:  # type: ignore[no-untyped-def]
    for task_id, rewrite, params in (("11p_Megablox_GMM", GROUPED_MATMUL, {"form": "pairs", "tile": 64}),
                                     ("10p_Sparse_MoE", ROUTED_EXPERTS, {"tile": 32})):
        task = load_task(task_id)
        report = declared_size_evaluator.evaluate(task, rewrite.render(task, params, ("cpu",)))
        assert report.passed, (task_id, report.reason)
        assert report.label == "jax"


def test_routed_experts_does_fewer_matmul_flops_than_the_dense_reference() -> None:
    task = load_task("10p_Sparse_MoE")
    args, static = task.get_inputs(jax.random.key(3))
    source = ROUTED_EXPERTS.render(task, {"tile": 32}, ("cpu",))
    kernel = _load(source)["kernel"]

    def flops(fn) -> float:  # type: ignore[no-untyped-def]
        analysis = jax.jit(lambda *a: fn(*a, **static)).lower(*args).compile().cost_analysis()
        return float((analysis[0] if isinstance(analysis, (list, tuple)) else analysis)["flops"])

    # XLA counts a while loop's body once: one tile per expert against the dense reference's full batch.
    assert flops(kernel) < 0.5 * flops(task.reference)


def test_blocked_attention_plans_only_visible_spans() -> None:
    rows = np.arange(8)[:, None]
    cols = np.arange(8)[None, :]
    causal = cols <= rows
    assert block_plan(causal, 4) == [(0, 4, ((0, 4),)), (4, 8, ((0, 8),))]
    window = (cols <= rows) & ((cols >= rows - 1) | (cols < 2))
    plan = block_plan(window, 4)
    assert plan[1] == (4, 8, ((0, 2), (3, 8)))


@pytest.mark.parametrize("task_id", ["4p_Sparse_Attention", "5p_Flex_Attention", "2p_GQA_Attention", "15p_RetNet_Retention"])
@pytest.mark.slow
def test_blocked_attention_is_correct_with_masks_biases_and_gqa(task_id: str, quick_evaluator) -> None:  # type: ignore[no-untyped-def]
    task = load_task(task_id)
    plan = match_attention(trace_program(task).dce())
    assert not isinstance(plan, str), plan
    assert plan.mask.mean() < 0.6  # causal or sparser: at least 40% of the scores are skipped
    source = BLOCKED_ATTENTION.render(task, {"block_q": 128}, ("cpu",))
    assert static_checks.scan(source)[0] == []
    assert "_PLAN" not in source and str(task.size("cpu")["seq"]) not in source  # planned from the arguments
    report = quick_evaluator.evaluate(task, source)
    assert report.passed, report.reason
    assert report.check("correct_unseen_size").passed  # another batch and sequence, drawn by the evaluator


@pytest.mark.slow
def test_blocked_attention_plans_a_partial_last_block_and_refuses_other_heads() -> None:
    task = load_task("2p_GQA_Attention")
    kernel = _load(BLOCKED_ATTENTION.render(task, {"block_q": 64}, ("cpu",)))["kernel"]
    sized = task.with_size("probe", {**task.size("cpu"), "seq": 150, "batch": 2})  # 2 whole blocks and 22 rows
    args, static = sized.get_inputs(jax.random.key(1), "probe")
    expected = np.asarray(sized.reference(*args, **static), np.float32)
    np.testing.assert_allclose(np.asarray(jax.jit(kernel)(*args), np.float32), expected, atol=2e-2, rtol=2e-2)
    other = task.with_size("heads", {**task.size("cpu"), "seq": 64, "q_heads": 4})
    args, static = other.get_inputs(jax.random.key(1), "heads")
    with pytest.raises(ValueError, match="serves q_heads=8, kv_heads=2, head_dim=64 .* not q_heads=4"):
        kernel(*args)


def test_blocked_attention_refuses_unmasked_or_input_dependent_masks() -> None:
    # 6p masks by per-sequence lengths (data): nothing is known when generating the candidate.
    assert isinstance(match_attention(trace_program(load_task("6p_Paged_Attention")).dce()), str)
    task = load_task("12p_RMSNorm")
    assert BLOCKED_ATTENTION.applies(task, analyze_task(task, "cpu")) is not None


def test_strategies_offer_structural_rewrites_with_their_spaces() -> None:
    task = load_task("14p_Ragged_Dot")
    names = {s.name: s for s in propose_strategies(task, analyze_task(task, "cpu"))}
    assert names["rewrite:grouped_matmul"].space["form"] == ["pairs", "loop"]


@pytest.mark.parametrize("chunk", [4, 16])
def test_paged_decode_matches_the_reference_at_every_length(chunk: int) -> None:
    task = load_task("6p_Paged_Attention")
    source = PAGED_DECODE.render(task, {"chunk_pages": chunk}, ("cpu", "full"))
    assert static_checks.scan(source)[0] == []
    kernel = jax.jit(_load(source)["kernel"])
    args, _ = task.get_inputs(jax.random.key(5))
    q, k_pages, v_pages, table, lengths = args
    max_len = table.shape[1] * k_pages.shape[2]
    # One key, a chunk boundary, just past it, a page boundary, and the whole table.
    for edge in ([1] * 12, [chunk * 16, chunk * 16 + 1, 16, 17, max_len, max_len - 1, 2, 3, 100, 500, 999, max_len]):
        lens = jnp.asarray(edge, jnp.int32)
        want = jax.jit(task.reference)(q, k_pages, v_pages, table, lens)
        got = kernel(q, k_pages, v_pages, table, lens)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), atol=2e-2, rtol=2e-2)


def test_paged_decode_recognises_paged_attention_and_nothing_else() -> None:
    roles = match_paged(trace_program(load_task("6p_Paged_Attention")).dce())
    assert not isinstance(roles, str), roles
    assert (roles.k_pages, roles.v_pages, roles.lengths) == ("k_pages", "v_pages", "lengths")
    assert roles.scale == pytest.approx(1 / np.sqrt(128))
    for other in ("7p_Ragged_Paged_Attention", "1p_Flash_Attention", "12p_RMSNorm"):
        assert isinstance(match_paged(trace_program(load_task(other)).dce()), str), other


def test_paged_decode_candidate_passes_the_evaluator(declared_size_evaluator) -> None:  # type: ignore[no-untyped-def]
    task = load_task("6p_Paged_Attention")
    report = declared_size_evaluator.evaluate(task, PAGED_DECODE.render(task, {"chunk_pages": 8}, ("cpu", "full")))
    assert report.passed and report.label == "jax", report.reason
