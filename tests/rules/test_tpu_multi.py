"""TPU templates for references with more than one matmul: each correct in interpret mode at a small size
with two or more steps on every grid axis, and lowering for tpu-v6e at its default blocks."""

from __future__ import annotations

import pytest
from jaxbench.task import load_task
from maxkernel.analysis import analyze_task
from maxkernel.rules.strategy import propose_strategies
from maxkernel.targets import validate_tpu
from maxkernel.templates.tpu_mlp import TPU_MLP, mlp_vmem_bytes, plan
from maxkernel.templates.tpu_moe import LAYOUT_SOURCE, TPU_MOE, computes_the_reference
from support import task_folder, task_yaml


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
    # The widest hidden step beside the most rows is the default (fewer steps, fewer re-splits of x).
    defaults = TPU_MLP.space(task, analyze_task(task, "tpu-v6e"), "tpu-v6e").defaults
    assert defaults["block_m"] == max(space["block_m"]) and defaults["block_h"] == max(space["block_h"]) == 1024


def test_the_chain_template_refuses_what_it_does_not_compute() -> None:
    assert "1 matmuls" in str(plan(load_task("8p_GEMM"), ("cpu",)))
    task = load_task("9p_SwiGLU_MLP")
    on_tpu = [s.name for s in propose_strategies(task, analyze_task(task, "tpu-v6e"), "tpu-v6e")]
    on_cpu = [s.name for s in propose_strategies(task, analyze_task(task), "cpu")]
    assert "template:tpu_mlp" in on_tpu and "template:tpu_mlp" not in on_cpu


@pytest.mark.slow
def test_moe_runs_each_token_through_its_chosen_experts_only(declared_size_evaluator) -> None:  # type: ignore[no-untyped-def]
    task = load_task("10p_Sparse_MoE")
    assert TPU_MOE.applies(task, analyze_task(task)) is None
    # cpu size: 128 tokens, 256 pairs over 8 experts in 128-row blocks; intermediate 512: 2 hidden blocks.
    source = TPU_MOE.render(task, {"block_m": 128, "block_h": 256}, ("cpu", "full"))
    assert "num_scalar_prefetch=2" in source and "expert[i]" in source
    report = declared_size_evaluator.evaluate(task, source)
    assert report.passed and report.label == "pallas-kernel", report.reason
    _lowers_at_defaults(TPU_MOE, task)


def test_moe_layout_puts_every_pair_in_a_block_of_its_expert() -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jax.experimental import pallas as pl

    namespace = {"jax": jax, "jnp": jnp, "pl": pl}
    exec(compile(LAYOUT_SOURCE, "layout", "exec"), namespace)
    top_idx = jnp.asarray([[3, 0], [3, 1], [0, 3], [2, 3], [3, 0]], jnp.int32)  # expert 3 five times
    row_of_pair, token_of_row, block_expert, used = namespace["_layout"](top_idx, 4, 2)
    rows, block_expert = np.asarray(row_of_pair), np.asarray(block_expert)
    assert len(set(rows.tolist())) == rows.size  # one row per pair
    assert (np.asarray(token_of_row)[rows] == np.repeat(np.arange(5), 2)).all()
    assert (block_expert[rows // 2] == np.asarray(top_idx).reshape(-1)).all()
    # experts 0, 1, 2, 3 hold 3, 1, 1, 5 pairs: 2 + 1 + 1 + 3 blocks of two rows, of cdiv(10, 2) + 4 = 9
    assert int(used[0]) == 7 and block_expert.tolist() == [0, 0, 1, 2, 3, 3, 3, 3, 3]


def test_moe_template_compares_the_reference_before_it_applies(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    assert "three weights multiply" in str(TPU_MOE.applies(load_task("9p_SwiGLU_MLP"), None))
    task = load_task("10p_Sparse_MoE")
    assert computes_the_reference(task)
    original = task.reference
    # Same arguments and shapes, another computation (every output doubled): refused.

    def doubled(x, w_router, w_gate, w_up, w_down, *, top_k):  # type: ignore[no-untyped-def]
        out = original(x, w_router, w_gate, w_up, w_down, top_k=top_k)
        return (out.astype("float32") * 2).astype(out.dtype)

    monkeypatch.setattr(type(task), "reference", property(lambda self: doubled))
    assert not computes_the_reference(task)


FUSED_MLP = '''\
import jax
import jax.numpy as jnp


def get_inputs(key, *, tokens, d_model, d_ff):
    k1, k2, k3 = jax.random.split(key, 3)
    h = jax.random.normal(k1, (tokens, d_model), jnp.float32)
    w_gate_up = jax.random.normal(k2, {gate_up_shape}, jnp.float32) / d_model ** 0.5
    w_down = jax.random.normal(k3, {down_shape}, jnp.float32) / d_ff ** 0.5
    return (h, w_gate_up, w_down), {{}}


def reference(h, w_gate_up, w_down):
    gu = {product}
    {cut}
    return (jax.nn.silu(gate) * up) @ {down}
'''


def _fused_task(tmp_path, name: str, transposed: bool, sliced: bool):  # type: ignore[no-untyped-def]
    cut = ("d_ff = gu.shape[-1] // 2\n    gate, up = gu[:, :d_ff], gu[:, d_ff:]" if sliced
           else "gate, up = jnp.split(gu, 2, axis=-1)")
    source = FUSED_MLP.format(
        gate_up_shape="(2 * d_ff, d_model)" if transposed else "(d_model, 2 * d_ff)",
        product="h @ w_gate_up.T" if transposed else "jnp.dot(h, w_gate_up)", cut=cut,
        down_shape="(d_model, d_ff)" if transposed else "(d_ff, d_model)", down="w_down.T" if transposed else "w_down")
    spec = task_yaml(name, "matmul", 0.02, {"tokens": 64, "d_model": 256, "d_ff": 512},
                     {"tokens": 256, "d_model": 1024, "d_ff": 4096}, "tokens")
    return task_folder(tmp_path, name, spec, source)


@pytest.mark.parametrize("transposed, sliced", [(False, False), (True, True)])
def test_a_fused_gate_up_weight_is_read_once_per_part(tmp_path, declared_size_evaluator, transposed: bool,
                                                      sliced: bool) -> None:  # type: ignore[no-untyped-def]
    """One weight holding gate and up side by side, its product split (or sliced) in halves: each half is a
    first stage read through its own block index into the one weight, never a copy of it."""
    task = _fused_task(tmp_path, f"fused_{int(transposed)}{int(sliced)}", transposed, sliced)
    p = plan(task, ("cpu", "full"))
    assert not isinstance(p, str), p
    assert p.fused_parts == 2 and p.hidden == 4096 and p.w_nk == transposed
    passes = TPU_MLP.space(task, analyze_task(task, "tpu-v6e"), "tpu-v6e").defaults["passes"]
    source = TPU_MLP.render(task, {"block_m": 32, "block_h": 128, "passes": passes}, ("cpu", "full"))
    assert "_activation(_product(x, w_gate_up_0_ref[...]), _product(x, w_gate_up_1_ref[...]))" in source
    assert ("(j + 1 * steps, 0)" if transposed else "(0, j + 1 * steps)") in source
    report = declared_size_evaluator.evaluate(task, source)  # cpu size: 2 row blocks by 4 hidden blocks a part
    assert report.passed and report.label == "pallas-kernel", report.reason
    _lowers_at_defaults(TPU_MLP, task)


def test_a_product_cut_into_unequal_parts_is_not_a_fused_weight(tmp_path) -> None:  # type: ignore[no-untyped-def]
    task = _fused_task(tmp_path, "unequal", False, True)
    source = task.reference_path.read_text().replace("gu[:, d_ff:]", "gu[:, 128:d_ff + 128]")  # overlapping parts
    task.reference_path.write_text(source)
    assert isinstance(plan(load_task(task.reference_path.parent), ("cpu",)), str)


def test_moe_roles_are_read_by_data_flow_whatever_the_order_and_names(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """10p with its arguments renamed and reordered (jaxbench's permute variant): the tokens are what three
    weights multiply, the router the 2-D one, the gate the one whose product feeds the sigmoid, the down
    weight the one that multiplies what they made; the static holding the top-k is found by its value."""
    from jaxbench.variants import derive
    from maxkernel.analysis.moe import task_roles
    from maxkernel.analysis.program import arg_names

    original = load_task("10p_Sparse_MoE")
    task = load_task(derive(original, "permute", tmp_path, seed=3))
    roles = task_roles(task, "cpu")
    assert not isinstance(roles, str), roles
    base = task_roles(original, "cpu")
    assert not isinstance(base, str)
    assert roles.names == tuple(arg_names(task)) != tuple(arg_names(original))
    assert (roles.tokens, roles.hidden, roles.intermediate, roles.experts, roles.k, roles.top_k) == \
        (base.tokens, base.hidden, base.intermediate, base.experts, base.k, base.top_k)
    assert TPU_MOE.applies(task, None) is None  # the roles confirmed: the reference computes what they say
