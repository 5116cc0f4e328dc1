"""Softmax attention inside a layer written for these tests (projections of one input, a kv-head repeat,
causal attention, an output projection and a residual): the flash kernel runs on the attention core and the
layer's own code before and after it runs in XLA, in TPU interpret mode, against the reference. A layer with
two attentions is refused by name."""

from __future__ import annotations

import jax
import numpy as np
from jax.experimental.pallas import tpu as pltpu

from jaxbench.static_checks import scan
from maxkernel.analysis import analyze_task
from maxkernel.rules.strategy import propose_strategies
from maxkernel.templates.attention import FLASH_ATTENTION, analyse
from support import task_folder, task_yaml

LAYER = '''\
import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, seq, width, heads, kv_heads, head_dim):
    ks = jax.random.split(key, 5)
    w = lambda k, n, m: jax.random.normal(k, (n, m), jnp.float32) / jnp.sqrt(jnp.float32(n))
    x = jax.random.normal(ks[0], (batch, seq, width), jnp.float32)
    return (x, w(ks[1], width, heads * head_dim), w(ks[2], width, kv_heads * head_dim),
            w(ks[3], width, kv_heads * head_dim), w(ks[4], heads * head_dim, width)), {"heads": heads, "kv_heads": kv_heads}


def reference(x, wq, wk, wv, wo, *, heads, kv_heads):
    b, s, _ = x.shape
    hp = jax.lax.Precision.HIGHEST
    split = lambda t, n: t.reshape(b, s, n, -1).transpose(0, 2, 1, 3)
    q, k, v = split(jnp.dot(x, wq, precision=hp), heads), split(jnp.dot(x, wk, precision=hp), kv_heads), \\
        split(jnp.dot(x, wv, precision=hp), kv_heads)
    k, v = jnp.repeat(k, heads // kv_heads, axis=1), jnp.repeat(v, heads // kv_heads, axis=1)
    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k, precision=hp) / jnp.sqrt(jnp.float32(q.shape[-1]))
    causal = jnp.tril(jnp.ones((s, s), dtype=bool))
    p = jax.nn.softmax(jnp.where(causal, scores, -jnp.inf), axis=-1)
    o = jnp.einsum("bhqk,bhkd->bhqd", p, v, precision=hp).transpose(0, 2, 1, 3).reshape(b, s, -1)
    return x + jnp.dot(o, wo, precision=hp)
'''

TWICE = LAYER.replace("    return x + jnp.dot(o, wo, precision=hp)", '''    o = jnp.dot(o, wo, precision=hp)
    q2 = split(o[..., : q.shape[1] * q.shape[3]] if o.shape[-1] >= q.shape[1] * q.shape[3] else jnp.dot(o, wq, precision=hp), heads)
    p2 = jax.nn.softmax(jnp.einsum("bhqd,bhkd->bhqk", q2, k, precision=hp), axis=-1)
    return x + jnp.einsum("bhqk,bhkd->bhqd", p2, v, precision=hp).transpose(0, 2, 1, 3).reshape(b, s, -1) @ wo''')

SIZES = {"cpu": {"batch": 1, "seq": 256, "width": 256, "heads": 4, "kv_heads": 2, "head_dim": 64},
         "full": {"batch": 2, "seq": 2048, "width": 2048, "heads": 16, "kv_heads": 4, "head_dim": 128}}


def _task(tmp_path, name: str, source: str):  # type: ignore[no-untyped-def]
    return task_folder(tmp_path, name, task_yaml(name, "attention", 1e-3, SIZES["cpu"], SIZES["full"], "seq"), source)


def test_the_core_of_a_layer_runs_as_flash_attention_in_tpu_interpret_mode(tmp_path) -> None:  # type: ignore[no-untyped-def]
    task = _task(tmp_path, "layer", LAYER)
    assert FLASH_ATTENTION.applies(task, analyze_task(task)) is None
    shape = analyse(task, "cpu")
    assert not isinstance(shape, str) and shape.around is not None and shape.q_heads == 4
    source = FLASH_ATTENTION.render(task, {"block_q": 128, "block_k": 128}, ("cpu", "full"))
    assert "def kernel(x, wq, wk, wv, wo, **static):" in source and "result = _core(q, k, v)" in source
    findings, _ = scan(source)
    assert findings == [], [str(f) for f in findings]
    namespace: dict = {}
    exec(compile(source, "candidate.py", "exec"), namespace)
    args, static = task.module.get_inputs(jax.random.PRNGKey(4), **SIZES["cpu"])
    with pltpu.force_tpu_interpret_mode():
        got = np.asarray(jax.jit(lambda *a: namespace["kernel"](*a, **static))(*args))
    np.testing.assert_allclose(got, np.asarray(task.reference(*args, **static)), rtol=1e-3, atol=1e-3)
    strategies = [s.name for s in propose_strategies(task, analyze_task(task, "tpu-v6e"), "tpu-v6e")]
    assert "template:flash_attention" in strategies


def test_the_code_around_the_core_is_one_function_that_reads_the_heads_from_the_statics(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The heads' reshape follows no argument's axis (``wq`` is [width, heads x head_dim]): the code before the
    core reads ``heads`` and ``kv_heads`` from the reference's statics, one function for every size, so the
    candidate runs at a size it was never traced at."""
    task = _task(tmp_path, "layer", LAYER)
    source = FLASH_ATTENTION.render(task, {"block_q": 128, "block_k": 128}, ("cpu", "full"))
    assert "def _stages(shapes):" not in source and source.count("def _before(") == 1
    assert "heads=static['heads']" in source
    namespace: dict = {}
    exec(compile(source, "candidate.py", "exec"), namespace)
    unseen = {"batch": 2, "seq": 384, "width": 192, "heads": 6, "kv_heads": 3, "head_dim": 32}
    args, static = task.module.get_inputs(jax.random.PRNGKey(5), **unseen)
    with pltpu.force_tpu_interpret_mode():
        got = np.asarray(jax.jit(lambda *a: namespace["kernel"](*a, **static))(*args))
    np.testing.assert_allclose(got, np.asarray(task.reference(*args, **static)), rtol=1e-3, atol=1e-3)


def test_two_attentions_are_not_cut(tmp_path) -> None:  # type: ignore[no-untyped-def]
    task = _task(tmp_path, "twice", TWICE)
    found = FLASH_ATTENTION.applies(task, analyze_task(task))
    assert found is not None and "2 softmax attentions" in found, found
