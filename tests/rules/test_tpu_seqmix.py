"""The TPU sequence-mixing templates on the suite's forms: retention (15p, served by the linear-attention
sketch), latent attention (3p) and the chunked SSD scan (16p).

Each is run in TPU interpret mode at a small size against the task's own reference, and its default blocks
at ``full`` lower for tpu-v6e."""

from __future__ import annotations

import functools
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from jaxbench.evaluate import shifted
from jaxbench.task import Task, load_task
from maxkernel.analysis import TaskAnalysis, analyze_task
from maxkernel.rewrites.emit import EmitError
from maxkernel.rules.strategy import templates_for
from maxkernel.targets import validate_tpu
from maxkernel.templates.tpu_mla import TPU_MLA
from maxkernel.templates.tpu_linear_attention import TPU_LINEAR_ATTENTION as TPU_RETENTION
from maxkernel.templates.tpu_ssd import TPU_SSD

RETENTION, MLA, SSD = "15p_RetNet_Retention", "3p_MLA_Attention", "16p_Mamba2_SSD"


def _module(source: str) -> types.ModuleType:
    module = types.ModuleType("candidate")
    exec(compile(source, "candidate.py", "exec"), module.__dict__)
    return module


def _interpret(module: types.ModuleType, args: list, static: dict) -> np.ndarray:
    with pltpu.force_tpu_interpret_mode():
        return np.asarray(jax.jit(lambda *a: module.kernel(*a, **static))(*args)).astype(np.float32)


@functools.cache
def _analysed(task_id: str) -> tuple[Task, TaskAnalysis]:
    task = load_task(task_id)
    return task, analyze_task(task)


# Each template, its own task, and a task that computes something else in a similar form.
@pytest.mark.parametrize(("template", "own", "other"), [(TPU_RETENTION, RETENTION, "1p_Flash_Attention"),
                                                         (TPU_MLA, MLA, RETENTION), (TPU_SSD, SSD, RETENTION)])
@pytest.mark.slow
def test_each_template_applies_to_its_computation_only(template, own, other) -> None:
    assert template.applies(*_analysed(own)) is None
    assert template.applies(*_analysed(other)) is not None


def test_the_planner_offers_them_on_tpu_targets() -> None:
    assert {TPU_RETENTION, TPU_MLA, TPU_SSD} <= set(templates_for("tpu-v6e"))
    assert not {TPU_RETENTION, TPU_MLA, TPU_SSD} & set(templates_for("cpu"))


def test_retention_matches_the_reference_in_tpu_interpret_mode() -> None:
    task = load_task(RETENTION)
    # Key blocks half the query blocks: rows of two and four key blocks, the diagonal cut through twice.
    module = _module(TPU_RETENTION.render(task, {"block_q": 256, "block_k": 128, "passes": 3}, ("cpu",)))
    assert module.CAUSAL  # the decay is zero above the diagonal whatever the inputs: those blocks are skipped
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal((1, 8, 512, 64)).astype(np.float32)) for _ in range(3))
    got = _interpret(module, [q, k, v], {"eps": 1e-5})
    expected = np.asarray(task.reference(q, k, v, eps=1e-5))
    np.testing.assert_allclose(got, expected, rtol=5e-4, atol=5e-4)
    with pytest.raises(ValueError, match="no score term for 4 heads"):
        module.kernel(q[:, :4], k[:, :4], v[:, :4], eps=1e-5)  # per-head constants it was not rendered for


def test_retention_reads_its_epsilon_and_scale_as_the_caller_passes_them() -> None:
    """The group norm's epsilon stays an argument of the kernel and the score scale is read from the head
    size, so one candidate serves every size it was rendered for."""
    text = TPU_RETENTION.render(load_task(RETENTION), {"block_q": 512, "block_k": 512, "passes": 6}, ("cpu", "full"))
    assert "def kernel(q, k, v, *, eps):" in text and "var + eps" in text and " 1e-05" not in text
    assert "q_ref.shape[-1] ** -0.5" in text


def test_retention_passes_follow_the_gemm_rule() -> None:
    task = load_task(RETENTION)
    with pytest.raises(EmitError, match="1 MXU passes"):  # f32 at HIGHEST: the 3-pass split or HIGHEST only
        TPU_RETENTION.render(task, {"block_q": 128, "block_k": 128, "passes": 1}, ("cpu",))
    highest = TPU_RETENTION.render(task, {"block_q": 128, "block_k": 128, "passes": 6}, ("cpu",))
    assert "Precision.HIGHEST" in highest and "_split" not in highest


@pytest.mark.slow
def test_mla_matches_the_reference_on_shifted_inputs_in_tpu_interpret_mode() -> None:
    task = load_task(MLA)
    module = _module(TPU_MLA.render(task, {"block_q": 128, "block_k": 128}, ("cpu",)))
    args, static = task.module.get_inputs(jax.random.PRNGKey(3), batch=1, seq=256, hidden=128, num_heads=2,
                                          q_lora_rank=64, kv_lora_rank=64, qk_nope_head_dim=32,
                                          qk_rope_head_dim=16, v_head_dim=48)
    # Shifted inputs give large scores: bf16 rounding of q, k or the latents would fail here.
    args = [jnp.asarray(a) for a in shifted([np.asarray(a) for a in args])]
    got = _interpret(module, args, static)
    expected = np.asarray(task.reference(*args, **static)).astype(np.float32)
    np.testing.assert_allclose(got, expected, rtol=3e-2, atol=6e-2)


@pytest.mark.slow
def test_ssd_matches_the_reference_across_chunks_in_tpu_interpret_mode() -> None:
    task = load_task(SSD)
    module = _module(TPU_SSD.render(task, {"chunk": 64, "block_h": 4, "passes": 3}, ("cpu",)))
    args, static = task.module.get_inputs(jax.random.PRNGKey(2), batch=2, seq=256, heads=8, head_dim=16,
                                          groups=2, state_dim=32)
    got = _interpret(module, list(args), static)  # four chunks: the state crosses three chunk boundaries
    expected = np.asarray(task.reference(*args, **static))
    np.testing.assert_allclose(got, expected, rtol=5e-4, atol=5e-4)


@pytest.mark.parametrize(("template", "task_id"), [(TPU_RETENTION, RETENTION), (TPU_MLA, MLA), (TPU_SSD, SSD)])
@pytest.mark.slow
def test_default_blocks_lower_for_tpu_v6e(template, task_id) -> None:
    task = load_task(task_id)
    space = template.space(task, analyze_task(task, "tpu-v6e"), "tpu-v6e")
    assert all(space.space[name] for name in space.defaults), space
    result = validate_tpu(template.render(task, space.defaults, ("cpu", "full")), task, "v6e")
    assert result.ok, result.reason


def _ssd_variant(tmp_path, edit=None):  # type: ignore[no-untyped-def]
    """The SSD task with its arguments renamed and reordered (jaxbench's permute variant), its reference
    text optionally edited."""
    from jaxbench.variants import derive

    folder = derive(load_task(SSD), "permute", tmp_path, seed=5)
    if edit is not None:
        path = folder / "reference.py"
        path.write_text(edit(path.read_text()))
    return load_task(folder)


@pytest.mark.slow
def test_ssd_roles_are_found_whatever_the_argument_order(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Renamed and reordered arguments: the roles come from shapes and the numeric probe (A or D, B or C
    by what the reference computes), the kernel keeps the reference's signature and names."""
    task = _ssd_variant(tmp_path)
    assert TPU_SSD.applies(task, analyze_task(task)) is None
    source = TPU_SSD.render(task, {"chunk": 64, "block_h": 4, "passes": 3}, ("cpu",))
    from maxkernel.analysis.program import arg_names

    assert f"def kernel({', '.join(arg_names(task))}):" in source
    module = _module(source)
    args, static = task.module.get_inputs(jax.random.PRNGKey(2), batch=2, seq=256, heads=8, head_dim=16,
                                          groups=2, state_dim=32)
    got = _interpret(module, list(args), static)
    expected = np.asarray(task.reference(*args, **static))
    np.testing.assert_allclose(got, expected, rtol=5e-4, atol=5e-4)


def test_an_ssd_without_its_skip_term_is_not_taken_for_one(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A near miss: the same chunked scan without ``D x`` has every shape the template reads, but not the
    recurrence it writes."""
    def drop_skip(text: str) -> str:
        lines = text.splitlines()
        last = max(i for i, line in enumerate(lines) if line.strip().startswith("return y +"))
        lines[last] = lines[last].split(" + ")[0]
        return "\n".join(lines) + "\n"

    task = _ssd_variant(tmp_path, drop_skip)
    reason = TPU_SSD.applies(task, analyze_task(task))
    assert reason is not None and "recurrence" in reason, reason


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["permute", "statics", "batch_added"])
def test_mla_is_matched_whatever_the_arguments_are_named_and_ordered(tmp_path, kind) -> None:  # type: ignore[no-untyped-def]
    """The latent attention layer with its arguments reordered and renamed, its epsilon and RoPE base
    folded into module constants, or mapped over a leading axis of one: roles and sizes come from the
    weights' shapes, the epsilon and RoPE base from the probe (statics or literals); the kernel keeps the
    reference's signature and is right on shifted inputs."""
    from jaxbench.variants import derive
    from maxkernel.analysis.program import arg_names

    task = load_task(derive(load_task(MLA), kind, tmp_path, seed=1))
    if kind == "statics":  # this seed folds them: the reference reads ROPE_THETA_CONST and EPS_CONST
        assert "ROPE_THETA_CONST = " in task.reference_path.read_text()
    assert TPU_MLA.applies(task, analyze_task(task)) is None
    source = TPU_MLA.render(task, {"block_q": 128, "block_k": 128}, ("cpu",))
    assert f"def kernel({', '.join(arg_names(task))}, *, " in source
    if kind == "statics":  # the constants found as literals are written as their values
        assert "_rotate(kv_a[..., lora:][:, :, None, :], 10000.0)" in source and ", 1e-06)" in source, source
    args, static = task.get_inputs(jax.random.PRNGKey(3), "cpu")
    args = [jnp.asarray(a) for a in shifted([np.asarray(a) for a in args])]
    rank = max(a.ndim for a in args)  # x's: the weights have one axis less
    small = [a[..., :256, :] if a.ndim == rank else a for a in args]  # 256 tokens: two query blocks, causal
    got = _interpret(_module(source), small, static)
    expected = np.asarray(task.reference(*small, **static)).astype(np.float32)
    np.testing.assert_allclose(got, expected, rtol=3e-2, atol=6e-2)


def test_an_attention_layer_without_latent_norms_is_not_taken_for_mla(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A near miss: the same layer with its query latent's RMS norm left out has every shape the template
    reads, but not the computation it writes."""
    from jaxbench.variants import derive

    folder = derive(load_task(MLA), "permute", tmp_path, seed=1)
    path = folder / "reference.py"
    head, body = path.read_text().split("def reference", 1)
    assert "_rms_norm(" in body
    path.write_text(head + "def reference" + body.replace("_rms_norm(", "_no_norm(", 1)
                    + "\n\ndef _no_norm(t, weight, eps):\n    return t * weight\n")
    task = load_task(folder)
    reason = TPU_MLA.applies(task, analyze_task(task))
    assert reason is not None, reason


@pytest.mark.slow
def test_ssd_in_bfloat16_is_computed_in_float32(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The SSD task with bfloat16 inputs and output (jaxbench's dtype variant): the kernel casts to float32
    and back, so it tracks the float32 recurrence on the same inputs (the bfloat16 reference itself is far
    off: its tolerance is in whole units)."""
    from jaxbench.variants import derive

    task = load_task(derive(load_task(SSD), "dtype", tmp_path, seed=1))
    assert task.spec.dtype == "bfloat16"
    assert TPU_SSD.applies(task, analyze_task(task)) is None
    module = _module(TPU_SSD.render(task, {"chunk": 64, "block_h": 4, "passes": 1}, ("cpu",)))
    args, static = task.module.get_inputs(jax.random.PRNGKey(2), batch=2, seq=256, heads=8, head_dim=16,
                                          groups=2, state_dim=32)
    got = _interpret(module, list(args), static)
    exact = np.asarray(load_task(SSD).reference(*(a.astype(jnp.float32) for a in args)))
    np.testing.assert_allclose(got.astype(np.float32), exact, rtol=5e-2, atol=5e-2)


def test_retention_blocks_a_length_that_is_no_power_of_two_by_its_divisors() -> None:
    """384 tokens with blocks of 256: 192-row query blocks (the largest divisor that is a multiple of a
    sublane tile), key blocks of 128 (a multiple of a lane tile), and the result still the reference's."""
    task = load_task(RETENTION)
    module = _module(TPU_RETENTION.render(task, {"block_q": 256, "block_k": 256, "passes": 3}, ("cpu",)))
    assert module._fit_rows(256, 384, 8) == 192 and module._fit_rows(512, 896, 8) == 448
    assert module._fit_rows(256, 384, 128) == 128 and module._fit_rows(256, 4096, 16) == 256
    rng = np.random.default_rng(1)
    q, k, v = (jnp.asarray(rng.standard_normal((1, 8, 384, 64)).astype(np.float32)) for _ in range(3))
    got = _interpret(module, [q, k, v], {"eps": 1e-5})
    expected = np.asarray(task.reference(q, k, v, eps=1e-5))
    np.testing.assert_allclose(got, expected, rtol=5e-4, atol=5e-4)
