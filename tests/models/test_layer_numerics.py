"""The bf16 layers' checks: tolerances measured against float64 accept the layer's own code under cpu and
TPU numerics, routing never flips between numerics, and a layer with one small bug is judged incorrect."""

from __future__ import annotations

import pytest
import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.layer_tolerance import input_sets, layer_need
from jaxbench.task import load_task
from maxkernel.evaluation import evaluate_candidate

SMALLEST = "mixtral_8x7b_moe"


@pytest.mark.slow
def test_tolerance_accepts_the_layer_against_float64_and_was_measured_not_guessed():
    task = load_task(SMALLEST)
    need = layer_need(task, seeds=(11,))  # seeds the tolerance was not set from
    atol = task.spec.tolerance.atol
    assert 0.0 < need["cpu"] <= atol and 0.0 < need["tpu"] <= atol
    assert atol <= 5.0 * max(need["cpu"], need["tpu"])  # headroom for a second bf16 implementation, no more


def _top_k_sets(inputs: list[np.ndarray], top_k: int, eps: float, dtype: jnp.dtype) -> np.ndarray:
    x, norm, router = (jnp.asarray(a, dtype) for a in inputs[:3])
    wide = jnp.promote_types(dtype, jnp.float32)
    f = x.astype(wide)
    h = norm * (f * jax.lax.rsqrt(jnp.mean(f * f, axis=-1, keepdims=True) + eps)).astype(dtype)
    logits = jnp.matmul(h.reshape(-1, h.shape[-1]), router, preferred_element_type=wide)
    return np.sort(np.asarray(jax.lax.top_k(logits, top_k)[1]), axis=-1)


def test_router_choice_is_the_same_in_bf16_and_float64_on_every_input_set():
    task = load_task(SMALLEST)
    _, static = task.get_inputs(jax.random.key(0))
    for inputs in input_sets(task, (3, 4)):
        low = _top_k_sets(inputs, static["top_k"], static["eps"], jnp.bfloat16)
        with jax.enable_x64(True):
            exact = _top_k_sets([a.astype(np.float64) for a in inputs], static["top_k"], static["eps"], jnp.float64)
        assert (low == exact).all()


@pytest.mark.slow
def test_the_layer_is_correct_on_tpu_and_a_wrong_rope_sign_is_not():
    task = load_task("llama31_8b_decoder")
    source = task.reference_path.read_text().replace("def reference(", "def kernel(")
    wrong = source.replace("x2 * cos + x1 * sin", "x2 * cos - x1 * sin")
    assert wrong != source
    right = evaluate_candidate(task, source, target="tpu-v6e")
    assert right.correct, right.reason
    report = evaluate_candidate(task, wrong, target="tpu-v6e")
    assert report.status == "incorrect" and "outside tolerance" in report.reason
