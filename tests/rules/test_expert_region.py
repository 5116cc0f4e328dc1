"""Routed experts on a model layer's expert region: the rewrite reads each shipped MoE layer's region form
(softmax after or before the top-k, sigmoid affinities with a selection bias), its candidate computes what
the region does on the region's own inputs while running each token through its chosen experts only, and
what it must not rewrite it refuses with a reason."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest

from jaxbench import static_checks
from jaxbench.task import load_task
from maxkernel.analysis.moe import moe_roles
from maxkernel.extract import extract_task
from maxkernel.rewrites.grouped import ROUTED_EXPERTS
from maxkernel.templates.tpu_moe import TPU_MOE

MOE_LAYERS = ("mixtral_8x7b_moe", "qwen3_moe_layer", "deepseek_v3_layer")


@pytest.fixture(scope="module")
def regions(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each MoE layer's expert region folder, and deepseek's shared-expert matmul beside it."""
    out = tmp_path_factory.mktemp("regions")
    found: dict[str, Path] = {}
    for layer in MOE_LAYERS:
        extraction = extract_task(layer, out, timing=False)
        for region in extraction.regions:
            if region.kind == "experts":
                found[layer] = Path(region.path)
            elif layer == "deepseek_v3_layer" and region.kind == "matmul" and found.get(layer):
                found.setdefault("deepseek_shared", Path(region.path))
    return found


def _run(source: str, task: object, seed: int) -> tuple[np.ndarray, np.ndarray]:
    namespace: dict = {}  # type: ignore[type-arg]
    exec(compile(source, "<candidate>", "exec"), namespace)
    args, static = task.get_inputs(jax.random.key(seed), "cpu")  # type: ignore[attr-defined]
    want = jax.jit(lambda *a: task.reference(*a, **static))(*args)  # type: ignore[attr-defined]
    got = jax.jit(lambda *a: namespace["kernel"](*a, **static))(*args)
    return np.asarray(got, np.float32), np.asarray(want, np.float32)


@pytest.mark.parametrize("layer", MOE_LAYERS)
@pytest.mark.parametrize("form", ["loop", "pairs"])
@pytest.mark.slow
def test_routed_experts_match_the_region_on_its_inputs(regions: dict[str, Path], layer: str, form: str) -> None:
    task = load_task(regions[layer])
    assert ROUTED_EXPERTS.applies(task, None) is None  # type: ignore[arg-type]
    source = ROUTED_EXPERTS.render(task, {"form": form, "tile": 64, "widen": False}, ("cpu",))
    assert static_checks.scan(source)[0] == []
    assert "_routed_experts(" in source
    assert ("jax.lax.while_loop" if form == "loop" else "_grouped_matmul") in source
    tol = task.spec.tolerance
    for seed in (0, 7):
        got, want = _run(source, task, seed)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=tol.atol, rtol=tol.rtol)


@pytest.mark.slow
def test_the_candidate_does_a_quarter_of_the_dense_expert_flops(regions: dict[str, Path]) -> None:
    task = load_task(regions["mixtral_8x7b_moe"])
    source = ROUTED_EXPERTS.render(task, {"form": "pairs", "tile": 64, "widen": False}, ("cpu",))
    namespace: dict = {}  # type: ignore[type-arg]
    exec(compile(source, "<candidate>", "exec"), namespace)
    args, _ = task.get_inputs(jax.random.key(0), "cpu")

    def flops(fn: object) -> float:
        return float(jax.jit(fn).lower(*args).compile().cost_analysis()["flops"])  # type: ignore[arg-type]

    # 256 tokens, top-2 of 8 experts: 512 (token, choice) rows in 64-row tiles, at most 8 + 7 tile pairs.
    assert flops(namespace["kernel"]) < 0.6 * flops(task.reference)


@pytest.mark.slow
def test_top_k_is_read_at_each_size(regions: dict[str, Path]) -> None:
    task = load_task(regions["qwen3_moe_layer"])  # top-2 of 8 at cpu, top-8 of 128 at full, no static argument
    assert (moe_roles(task, "cpu").k, moe_roles(task, "full").k) == (2, 8)  # type: ignore[union-attr]
    source = ROUTED_EXPERTS.render(task, {"form": "loop", "tile": 32, "widen": False}, ("cpu", "full"))
    assert "def _routing_cpu(" in source and "def _routing_full(" in source
    cpu = source[source.index("def _routing_cpu("):source.index("def _epilogue_cpu(")]
    full = source[source.index("def _routing_full("):source.index("def _epilogue_full(")]
    assert "jax.lax.top_k(probs, 2)" in cpu and "jax.lax.top_k(probs, 8)" in full
    got, want = _run(source, task, 3)
    np.testing.assert_allclose(got, want, atol=task.spec.tolerance.atol, rtol=task.spec.tolerance.rtol)


def test_the_tpu_template_refuses_routing_it_does_not_compute(regions: dict[str, Path]) -> None:
    for layer in ("qwen3_moe_layer", "deepseek_v3_layer"):
        reason = TPU_MOE.applies(load_task(regions[layer]), None)  # type: ignore[arg-type]
        assert reason is not None and "routes from the router's f32 logits" in reason


def test_a_matmul_region_is_refused_with_a_reason(regions: dict[str, Path]) -> None:
    reason = ROUTED_EXPERTS.applies(load_task(regions["deepseek_shared"]), None)  # type: ignore[arg-type]
    assert reason is not None and "expert region" in reason


DENSE = '''
import jax
import jax.numpy as jnp


def get_inputs(key, *, tokens, hidden, experts, intermediate):
    ks = jax.random.split(key, 5)
    logits = jax.random.normal(ks[0], (tokens, experts), jnp.float32)
    h = jax.random.normal(ks[1], (tokens, hidden), jnp.float32).astype(jnp.bfloat16)
    w = [(jax.random.normal(k, s, jnp.float32) / 8).astype(jnp.bfloat16) for k, s in
         ((ks[2], (experts, hidden, intermediate)), (ks[3], (experts, hidden, intermediate)),
          (ks[4], (experts, intermediate, hidden)))]
    return (logits, h, *w), {}


def reference(logits, h, w_gate, w_up, w_down):
    _, top_idx = jax.lax.top_k(logits, 2)
    gates = jax.nn.softmax(logits, axis=-1) + 0.0 * top_idx[:, :1]  # every expert weighted: nothing to skip
    gate = jnp.einsum("td,edf->etf", h, w_gate)
    up = jnp.einsum("td,edf->etf", h, w_up)
    out = jnp.einsum("etf,efd->etd", jax.nn.silu(gate) * up, w_down)
    return jnp.einsum("etd,te->td", out, gates.astype(h.dtype), preferred_element_type=jnp.float32).astype(h.dtype)
'''


def test_dense_combine_weights_are_refused(tmp_path: Path) -> None:
    (tmp_path / "reference.py").write_text(DENSE)
    (tmp_path / "task.yaml").write_text(
        "id: dense_experts\nname: dense experts\ncategory: moe\ndescription: every expert weighted\n"
        "dtype: bfloat16\ntolerance: {atol: 1.0e-1, rtol: 2.0e-2}\n"
        "sizes:\n  cpu: {tokens: 64, hidden: 32, experts: 4, intermediate: 48}\n"
        "  full: {tokens: 128, hidden: 32, experts: 4, intermediate: 48}\n")
    reason = ROUTED_EXPERTS.applies(load_task(tmp_path), None)  # type: ignore[arg-type]
    assert reason is not None and "not the top-k choice one-hot" in reason
