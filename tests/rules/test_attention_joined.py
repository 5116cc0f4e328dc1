"""Attention whose scores are a sum of products (latent attention's plain and RoPE parts, the RoPE key one per
token shared by every head), written for these tests: the flash kernel computes it from the parts joined
along the head dimension, in TPU interpret mode, against the reference; the values' head dimension differs
from the scores'. Near misses (the parts multiplied or subtracted, not added) are
refused with their reasons."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from maxkernel.analysis import analyze_task
from maxkernel.analysis.program import trace_program
from maxkernel.rules.strategy import propose_strategies
from maxkernel.targets import validate_tpu
from maxkernel.templates.attention import FLASH_ATTENTION, analyse
from maxkernel.templates.attention_joined import find_joined
from support import task_folder, task_yaml

INPUTS = '''\
import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, heads, seq, nope, rope, dv):
    k1, k2, k3, k4, k5 = jax.random.split(key, 5)
    draw = lambda k, shape: jax.random.normal(k, shape, jnp.float32).astype(jnp.bfloat16)
    return (draw(k1, (batch, seq, heads, rope)), draw(k2, (batch, heads, seq, nope)), draw(k3, (batch, heads, seq, dv)),
            draw(k4, (batch, heads, seq, nope)), draw(k5, (batch, seq, 1, rope))), {}

'''

# Token-major RoPE parts (the key's shared by every head), the values before the plain keys, causal.
LATENT = INPUTS + '''
def reference(q_pe, q_c, values, k_c, k_pe):
    wide = jnp.float32
    s = jnp.einsum("bhqd,bhkd->bhqk", q_c, k_c, preferred_element_type=wide)
    s = s + jnp.einsum("bqhr,bkxr->bhqk", q_pe, k_pe, preferred_element_type=wide)
    s = s / jnp.sqrt(jnp.float32(q_c.shape[-1] + q_pe.shape[-1]))
    n = s.shape[-1]
    s = jnp.where(jnp.tril(jnp.ones((n, n), dtype=bool)), s, -jnp.inf)
    p = jax.nn.softmax(s, axis=-1).astype(values.dtype)
    return jnp.einsum("bhqk,bhkd->bhqd", p, values, preferred_element_type=wide).astype(values.dtype)
'''

NEAR_MISSES = {
    "parts multiplied": (LATENT.replace("s = s + jnp.einsum", "s = s * jnp.einsum"), "not one sum of every product"),
    "parts subtracted": (LATENT.replace("s = s + jnp.einsum", "s = s - jnp.einsum"), "not one sum of every product"),
}

SIZES = {"cpu": {"batch": 1, "heads": 4, "seq": 256, "nope": 64, "rope": 32, "dv": 64},
         "full": {"batch": 1, "heads": 16, "seq": 2048, "nope": 128, "rope": 64, "dv": 128}}


def _task(tmp_path, name: str, source: str):  # type: ignore[no-untyped-def]
    return task_folder(tmp_path, name, task_yaml(name, "attention", 2e-2, SIZES["cpu"], SIZES["full"], "seq", "bfloat16"),
                       source)


def test_latent_attention_runs_on_the_joined_parts_in_tpu_interpret_mode(tmp_path) -> None:  # type: ignore[no-untyped-def]
    task = _task(tmp_path, "latent", LATENT)
    assert FLASH_ATTENTION.applies(task, analyze_task(task)) is None
    shape = analyse(task, "cpu")
    assert not isinstance(shape, str) and (shape.head_dim, shape.v_dim) == (96, 64)
    source = FLASH_ATTENTION.render(task, {"block_q": 128, "block_k": 128}, ("cpu",))
    assert "def kernel(q_pe, q_c, values, k_c, k_pe):" in source
    assert "q = _joined([q_c, jnp.transpose(q_pe, (0, 2, 1, 3))])" in source
    assert "k = _joined([k_c, jnp.transpose(k_pe, (0, 2, 1, 3))])" in source
    namespace: dict = {}
    exec(compile(source, "candidate.py", "exec"), namespace)
    args, static = task.module.get_inputs(jax.random.PRNGKey(5), **SIZES["cpu"])
    with pltpu.force_tpu_interpret_mode():
        got = np.asarray(jax.jit(namespace["kernel"])(*args, **static), np.float32)
    expected = np.asarray(task.reference(*args, **static), np.float32)
    np.testing.assert_allclose(got, expected, rtol=2e-2, atol=2e-2)
    strategies = [s.name for s in propose_strategies(task, analyze_task(task, "tpu-v6e"), "tpu-v6e")]
    assert "template:flash_attention" in strategies


def test_the_parts_are_found_by_data_flow(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The RoPE key's heads axis, of one, is summed away by the reference: it is read as missing, and the
    key is broadcast over the heads when the parts are joined."""
    joined = find_joined(trace_program(_task(tmp_path, "latent", LATENT), "cpu").dce())
    assert not isinstance(joined, str)
    assert [o.arg for o in joined.queries] == [1, 0] and [o.arg for o in joined.keys] == [3, 4]
    assert joined.values == 2 and joined.keys[1].roles == (0, 3, None, "d")


@pytest.mark.parametrize("name", sorted(NEAR_MISSES))
def test_near_misses_are_refused_with_their_reason(tmp_path, name) -> None:  # type: ignore[no-untyped-def]
    source, reason = NEAR_MISSES[name]
    task = _task(tmp_path, name.replace(" ", "_"), source)
    found = FLASH_ATTENTION.applies(task, analyze_task(task))
    assert found is not None and reason in found, found


@pytest.mark.slow
def test_default_blocks_lower_for_tpu_v6e(tmp_path) -> None:  # type: ignore[no-untyped-def]
    task = _task(tmp_path, "latent", LATENT)
    space = FLASH_ATTENTION.space(task, analyze_task(task, "tpu-v6e"), "tpu-v6e")
    result = validate_tpu(FLASH_ATTENTION.render(task, space.defaults, ("cpu", "full")), task, "v6e")
    assert result.ok, result.reason
