"""The TPU cross-entropy template: an online logsumexp over vocab blocks and the label's logit."""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas import tpu as pltpu

from jaxbench.task import load_task
from maxkernel.analysis import analyze_task
from maxkernel.targets import validate_tpu
from maxkernel.targets.check_size import derive_check_size
from maxkernel.targets.loader import load_candidate
from maxkernel.targets.specs import load_tpu_spec
from maxkernel.templates.tpu_xent import TPU_XENT


def test_applies_to_cross_entropy_only() -> None:
    task = load_task("13p_Cross_Entropy")
    assert TPU_XENT.applies(task, analyze_task(task)) is None
    for other in ("12p_RMSNorm", "50k_Matmul_GELU_Softmax"):
        assert TPU_XENT.applies(load_task(other), analyze_task(load_task(other))) is not None


def test_online_logsumexp_over_vocab_blocks_matches_the_loss_in_tpu_interpret_mode() -> None:
    task = load_task("13p_Cross_Entropy")
    module = types.ModuleType("candidate")
    exec(compile(TPU_XENT.render(task, {"block_t": 8, "block_v": 256}, ("cpu",)), "candidate.py", "exec"),
         module.__dict__)
    rng = np.random.default_rng(1)
    logits = rng.uniform(-5.0, 5.0, (16, 768)).astype(np.float32)
    logits[3, 700] = 40.0  # a row whose max is in the last vocab block: the running sum must be rescaled
    labels = np.array([0, 255, 256, 700, 767, 511, 512, 1] * 2, np.int32)  # each block, its edges
    with pltpu.force_tpu_interpret_mode():
        got = np.asarray(jax.jit(module.kernel)(jnp.asarray(logits), jnp.asarray(labels)))
    top = logits.max(axis=1)
    expected = top + np.log(np.exp(logits - top[:, None]).sum(axis=1)) - logits[np.arange(16), labels]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_default_blocks_lower_and_have_a_checkable_twin() -> None:
    task = load_task("13p_Cross_Entropy")
    space = TPU_XENT.space(task, analyze_task(task, "tpu-v6e"), "tpu-v6e")
    bt, bv = space.defaults["block_t"], space.defaults["block_v"]
    assert bt % 8 == 0 and bv % 128 == 0 and 128256 % bv == 0
    source = TPU_XENT.render(task, space.defaults, ("cpu", "full"))
    result = validate_tpu(source, task, "v6e")
    assert result.ok, result.reason
    check = derive_check_size(load_candidate(source), task, load_tpu_spec("v6e"), interpreted=True)
    assert check.refusal is None, check.refusal
    assert check.values["tokens"] // bt >= 2 and check.values["vocab"] // bv >= 2
