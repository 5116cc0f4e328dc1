"""The TPU linear-attention sketch on computations written for these tests: a gated (data-dependent) decay
with a row-sum normalizer, written keys-first with its arguments in another order; a per-head decay read
from an input, without a normalizer; a decay that hides nothing; the gated form token-major. Each runs in TPU interpret mode against its
own reference; the near misses (a softmax, a sum over the queries, a nonlinearity after the normalizer) are
refused with their reasons."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from maxkernel.analysis import analyze_task
from maxkernel.rules.strategy import propose_strategies
from maxkernel.targets import validate_tpu
from maxkernel.templates.tpu_linear_attention import TPU_LINEAR_ATTENTION
from support import task_folder, task_yaml

INPUTS = '''\
import jax
import jax.numpy as jnp

HIGHEST = jax.lax.Precision.HIGHEST


def get_inputs(key, *, batch, heads, seq, dim):
    k1, k2, k3, k4 = jax.random.split(key, 4)
    gates = jax.random.normal(k1, (batch, heads, seq), jnp.float32) - 3.0
    values = jax.random.normal(k2, (batch, heads, seq, dim), jnp.float32)
    keys = jax.random.normal(k3, (batch, heads, seq, dim), jnp.float32)
    queries = jax.random.normal(k4, (batch, heads, seq, dim), jnp.float32)
    return (gates, values, keys, queries), {}

'''

# Mamba-2's quadratic form in another hand: log-sigmoid gates, their running sum, the segment sums masked to
# zero above the diagonal after the exponential, the scores normalised by their absolute row sum plus one.
GATED = INPUTS + '''
def reference(gates, values, keys, queries):
    cs = jnp.cumsum(jax.nn.log_sigmoid(gates), axis=-1)
    t = jnp.arange(cs.shape[-1])
    weights = jnp.where(t[:, None] >= t[None, :], jnp.exp(cs[..., :, None] - cs[..., None, :]), 0.0)
    att = jnp.einsum("bhik,bhjk->bhij", queries, keys, precision=HIGHEST) * weights
    denom = jnp.sum(jnp.abs(att), axis=-1, keepdims=True) + 1.0
    return jnp.einsum("bhij,bhjk->bhik", att / denom, values, precision=HIGHEST)
'''

# RetNet's retention with its per-head rates given as an argument, scaled queries, ``jnp.tril``, no norm.
DECAYED = '''\
import jax
import jax.numpy as jnp

HIGHEST = jax.lax.Precision.HIGHEST


def get_inputs(key, *, batch, heads, seq, dim):
    k1, k2, k3 = jax.random.split(key, 3)
    q = jax.random.normal(k1, (batch, heads, seq, dim), jnp.float32)
    k = jax.random.normal(k2, (batch, heads, seq, dim), jnp.float32)
    v = jax.random.normal(k3, (batch, heads, seq, dim), jnp.float32)
    rates = 1.0 - 2.0 ** (-5.0 - jnp.arange(heads, dtype=jnp.float32))
    return (q, k, v, rates), {}


def reference(q, k, v, rates):
    pos = jnp.arange(q.shape[2], dtype=jnp.float32)
    dist = pos[:, None] - pos[None, :]
    decay = jnp.tril(jnp.exp(dist[None] * jnp.log(rates)[:, None, None]))
    scores = jnp.einsum("bhqd,bhkd->bhqk", q * q.shape[-1] ** -0.5, k, precision=HIGHEST)
    return jnp.einsum("bhqk,bhkd->bhqd", scores * decay[None], v, precision=HIGHEST)
'''

# A decay that is never zero, weighted by a gate per key: every block pair is computed.
SYMMETRIC = INPUTS + '''
def reference(gates, values, keys, queries):
    t = jnp.arange(queries.shape[2], dtype=jnp.float32)
    weights = jnp.exp(-jnp.abs(t[:, None] - t[None, :]) / 64.0) * jax.nn.sigmoid(gates)[..., None, :]
    att = jnp.einsum("bhik,bhjk->bhij", queries, keys, precision=HIGHEST) * weights
    return jnp.einsum("bhij,bhjk->bhik", att, values, precision=HIGHEST)
'''

# The gated form kept token-major ([batch, seq, heads, dim], as many model codebases keep it), the gates
# moved to heads-first for the decay, the output token-major again.
TOKEN_MAJOR = '''\
import jax
import jax.numpy as jnp

HIGHEST = jax.lax.Precision.HIGHEST


def get_inputs(key, *, batch, heads, seq, dim):
    k1, k2, k3, k4 = jax.random.split(key, 4)
    x = jax.random.normal(k1, (batch, seq, heads, dim), jnp.float32)
    b = jax.random.normal(k2, (batch, seq, heads, dim), jnp.float32)
    c = jax.random.normal(k3, (batch, seq, heads, dim), jnp.float32)
    gates = jax.random.normal(k4, (batch, seq, heads), jnp.float32) - 3.0
    return (x, b, c, gates), {}


def reference(x, b, c, gates):
    cs = jnp.cumsum(jax.nn.log_sigmoid(gates), axis=1).transpose(0, 2, 1)
    t = jnp.arange(cs.shape[-1])
    weights = jnp.where(t[:, None] >= t[None, :], jnp.exp(cs[..., :, None] - cs[..., None, :]), 0.0)
    att = jnp.einsum("bihn,bjhn->bhij", c, b, precision=HIGHEST) * weights
    return jnp.einsum("bhij,bjhp->bihp", att, x, precision=HIGHEST)
'''

NEAR_MISSES = {
    "softmax": (INPUTS + '''
def reference(gates, values, keys, queries):
    s = jnp.einsum("bhik,bhjk->bhij", queries, keys, precision=HIGHEST)
    return jnp.einsum("bhij,bhjk->bhik", jax.nn.softmax(s, axis=-1), values, precision=HIGHEST)
''', "more than one value"),
    "sum over the queries": (INPUTS + '''
def reference(gates, values, keys, queries):
    att = jnp.einsum("bhik,bhjk->bhij", queries, keys, precision=HIGHEST)
    att = att / (jnp.sum(jnp.abs(att), axis=-2, keepdims=True) + 1.0)
    return jnp.einsum("bhij,bhjk->bhik", att, values, precision=HIGHEST)
''', "one value per row"),
    "tanh after the normalizer": (INPUTS + '''
def reference(gates, values, keys, queries):
    att = jnp.einsum("bhik,bhjk->bhij", queries, keys, precision=HIGHEST)
    att = jnp.tanh(att / (jnp.sum(jnp.abs(att), axis=-1, keepdims=True) + 1.0))
    return jnp.einsum("bhij,bhjk->bhik", att, values, precision=HIGHEST)
''', "right before the value product"),
}

SIZES = {"cpu": {"batch": 2, "heads": 2, "seq": 256, "dim": 32}, "full": {"batch": 2, "heads": 8, "seq": 2048, "dim": 64}}


def _task(tmp_path, name: str, source: str):  # type: ignore[no-untyped-def]
    return task_folder(tmp_path, name, task_yaml(name, "attention", 1e-4, SIZES["cpu"], SIZES["full"], "seq"), source)


def _run(task, params: dict) -> tuple[str, np.ndarray, np.ndarray]:  # type: ignore[no-untyped-def]
    """The candidate at ``params`` in TPU interpret mode and the reference, on a draw at the cpu size."""
    source = TPU_LINEAR_ATTENTION.render(task, params, ("cpu",))
    namespace: dict = {}
    exec(compile(source, "candidate.py", "exec"), namespace)
    args, static = task.module.get_inputs(jax.random.PRNGKey(3), **SIZES["cpu"])
    with pltpu.force_tpu_interpret_mode():
        got = np.asarray(jax.jit(namespace["kernel"])(*args, **static))
    return source, got, np.asarray(task.reference(*args, **static))


@pytest.mark.parametrize(("name", "source", "causal"), [("gated", GATED, True), ("decayed", DECAYED, True),
                                                        ("symmetric", SYMMETRIC, False), ("token_major", TOKEN_MAJOR, True)])
def test_linear_attention_matches_its_reference_in_tpu_interpret_mode(tmp_path, name, source, causal) -> None:  # type: ignore[no-untyped-def]
    task = _task(tmp_path, name, source)
    assert TPU_LINEAR_ATTENTION.applies(task, analyze_task(task)) is None
    # Blocks of 128 over 256 positions: two query blocks, the diagonal inside the first and last steps.
    text, got, expected = _run(task, {"block_q": 128, "block_k": 128, "passes": 6})
    assert f"CAUSAL = {causal}" in text
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_the_gated_form_keeps_the_references_signature_and_reads_its_gates_per_block(tmp_path) -> None:  # type: ignore[no-untyped-def]
    task = _task(tmp_path, "gated", GATED)
    text = TPU_LINEAR_ATTENTION.render(task, {"block_q": 128, "block_k": 128, "passes": 6}, ("cpu",))
    assert "def kernel(gates, values, keys, queries):" in text
    assert "jax.lax.cumsum" in text and "sum_ref[...] += jnp.sum(" in text  # the running sum by XLA, the row sum beside
    strategies = [s.name for s in propose_strategies(task, analyze_task(task, "tpu-v6e"), "tpu-v6e")]
    assert "template:tpu_linear_attention" in strategies


@pytest.mark.parametrize("name", sorted(NEAR_MISSES))
def test_near_misses_are_refused_with_their_reason(tmp_path, name) -> None:  # type: ignore[no-untyped-def]
    source, reason = NEAR_MISSES[name]
    task = _task(tmp_path, name.replace(" ", "_"), source)
    found = TPU_LINEAR_ATTENTION.applies(task, analyze_task(task))
    assert found is not None and reason in found, found


@pytest.mark.slow
def test_default_blocks_lower_for_tpu_v6e(tmp_path) -> None:  # type: ignore[no-untyped-def]
    task = _task(tmp_path, "gated", GATED)
    space = TPU_LINEAR_ATTENTION.space(task, analyze_task(task, "tpu-v6e"), "tpu-v6e")
    assert space.space["block_q"] and space.defaults["passes"] in (3, 6), space
    result = validate_tpu(TPU_LINEAR_ATTENTION.render(task, space.defaults, ("cpu", "full")), task, "v6e")
    assert result.ok, result.reason


def test_a_token_major_form_is_moved_around_the_kernel(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Arguments kept [batch, seq, heads, dim] (the values first): the kernel runs on them moved to
    [batch, heads, seq, dim] and its output is moved back; the wrapper keeps the reference's signature."""
    task = _task(tmp_path, "token_major", TOKEN_MAJOR)
    text = TPU_LINEAR_ATTENTION.render(task, {"block_q": 128, "block_k": 128, "passes": 6}, ("cpu",))
    assert "def kernel(x, b, c, gates):" in text and "def _linear_attention(c, b, x, gates):" in text
    assert "c_bhsd = jnp.transpose(c, (0, 2, 1, 3))" in text


def test_blocks_below_the_diagonal_take_the_selects_case(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The gated form masks with a select of positions: on and below the diagonal it keeps the decay, so a
    block wholly below computes the decay alone; both branches run at 256 positions in blocks of 128 (the
    block (1, 0) lies below) and the result is the reference's."""
    task = _task(tmp_path, "gated", GATED)
    text, got, expected = _run(task, {"block_q": 128, "block_k": 128, "passes": 6})
    below = text[text.index("def _below():"):text.index("@pl.when((flags & LAST)")]
    assert "jnp.where" not in below and "jnp.where" in text[text.index("def _crossed():"):text.index("def _below():")]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
