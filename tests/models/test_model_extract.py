"""Extraction: every shipped layer splits into region tasks that re-join to the layer."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxbench.task import list_models, load_task
from jaxbench.task_check import check_task
from maxkernel.extract import extract_task
from maxkernel.targets.check_size import at_ladder, check_ladder
from maxkernel.extract.regions import Span, merge_routed
from maxkernel.extract.rejoin import rejoin, run_regions
from maxkernel.templates.tpu_moe import plan as moe_plan

LAYERS = [t.id for t in list_models()]


@pytest.mark.parametrize("layer_id", LAYERS)
@pytest.mark.slow
def test_regions_rejoin_to_the_layer(layer_id, tmp_path):
    extraction = extract_task(layer_id, tmp_path, timing=False)
    assert len(extraction.regions) >= 2
    covered = [r.nodes for r in extraction.regions]
    assert covered[0][0] == 0 and all(a[1] == b[0] for a, b in zip(covered, covered[1:]))
    assert rejoin(extraction).ok


def test_a_wrong_region_breaks_the_rejoin(tmp_path):
    extraction = extract_task("mixtral_8x7b_moe", tmp_path, timing=False)
    hot = extraction.regions[-1]
    reference = load_task(hot.path).reference
    layer = load_task("mixtral_8x7b_moe")
    args, static = layer.get_inputs(jax.random.key(3))
    right = run_regions(extraction, args)
    wrong = run_regions(extraction, args, {hot.index: lambda *a: reference(*a) * 1.01})
    expected = jax.jit(lambda *a: layer.reference(*a, **static))(*args)
    np.testing.assert_allclose(right[0], expected, atol=2e-3, rtol=2e-3)
    assert not np.allclose(wrong[0], expected, atol=2e-3, rtol=2e-3)
    # Routing and the experts are one region, which the routed-experts kernel reads: the router's logits,
    # the normed tokens, gate, up and down, and the residual the experts' sum is added to.
    assert [r.kind for r in extraction.regions] == ["matmul", "experts"]
    roles = moe_plan(load_task(hot.path), ("cpu", "full"))
    assert not isinstance(roles, str), roles
    assert roles.from_logits and (roles.gate, roles.up, roles.down, roles.residual) == ("w_gate", "w_up", "w_down", "x")
    assert (roles.k, roles.experts, roles.tokens) == (2, 8, 8192)


def test_routing_merges_with_the_expert_regions_after_it():
    spans = [Span(0, 3, "matmul"), Span(3, 5, "routing"), Span(5, 7, "matmul"), Span(7, 9, "experts"),
             Span(9, 10, "experts"), Span(10, 12, "matmul")]
    assert [(s.start, s.end, s.kind) for s in merge_routed(spans)] == [
        (0, 3, "matmul"), (3, 10, "experts"), (10, 12, "matmul")]
    alone = [Span(0, 2, "routing"), Span(2, 4, "matmul")]  # no expert region after it: left as it is
    assert [(s.start, s.end, s.kind) for s in merge_routed(alone)] == [(0, 2, "routing"), (2, 4, "matmul")]


def test_the_check_ladder_shrinks_a_width_with_the_others_at_full():
    ladder = check_ladder(load_task("mixtral_8x7b_moe"))
    full = load_task("mixtral_8x7b_moe").size("full")
    # seq down to its floor, then intermediate alone (a kernel whose blocks follow hidden keeps it at full)
    assert ladder["seq_256_intermediate_1792"] == {**full, "seq": 256, "intermediate": 1792}
    assert ladder["seq_256_hidden_256_intermediate_1792"] == {**full, "seq": 256, "hidden": 256, "intermediate": 1792}
    assert [n for n in ladder if n.startswith("seq_") and "_" not in n[4:]] == [
        "seq_4096", "seq_2048", "seq_1024", "seq_512", "seq_256"]


def test_code_written_per_size_is_asked_for_at_each_rung_of_the_ladder_that_traces():
    task = load_task("mixtral_8x7b_moe")
    asked = []

    def at(task_at, size):
        asked.append(size)
        if task_at.size(size)["seq"] == 1024:
            raise ValueError("the reference's own code fails here")
        return None if task_at.size(size)["seq"] == 512 else task_at.size(size)["seq"]

    # The first parameter's rungs only, each as a task holding that size; a rung that fails or gives
    # nothing adds nothing.
    assert at_ladder(task, at) == {"seq_4096": 4096, "seq_2048": 2048, "seq_256": 256}
    assert asked == ["seq_4096", "seq_2048", "seq_1024", "seq_512", "seq_256"]


@pytest.mark.slow
def test_attention_is_one_region_and_region_tasks_are_sound(tmp_path):
    extraction = extract_task("llama31_8b_decoder", tmp_path, target="cpu")
    kinds = [r.kind for r in extraction.regions]
    assert kinds.count("attention") == 1
    assert abs(sum(r.share for r in extraction.regions) - 1.0) < 1e-6
    attention = next(r for r in extraction.regions if r.kind == "attention")
    assert len(attention.inputs) == 3 and attention.flops > 0  # the core: q, k, v in, one output
    before = extraction.regions[attention.index - 1]
    after = extraction.regions[attention.index + 1]
    assert {"wq", "wk", "wv"} <= set(before.inputs) and "wo" in after.inputs
    for info in extraction.regions:
        region = load_task(info.path)
        assert region.spec.tolerance == load_task("llama31_8b_decoder").spec.tolerance
        check = check_task(region, timing=False)
        assert check.ok, (info.task_id, check.problems)


def test_extract_a_users_function(tmp_path):
    import maxkernel

    def block(x, w1, w2):
        h = x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6)
        return x + jax.nn.gelu(h @ w1) @ w2

    keys = jax.random.split(jax.random.key(0), 3)
    args = (jax.random.normal(keys[0], (64, 128)), jax.random.normal(keys[1], (128, 256)),
            jax.random.normal(keys[2], (256, 128)))
    extraction = maxkernel.extract(block, *args, out=tmp_path, timing=False)
    assert [r.kind for r in extraction.regions] == ["matmul", "matmul"]
    assert rejoin(extraction).ok
    assert Path(extraction.regions[0].path, "task.yaml").is_file()
