"""Attention written in another layout and argument order is read by data flow and served by the flash
kernel, its arguments moved around it; a near miss (keys tiled, not repeated, over the heads) is not."""

from __future__ import annotations

from pathlib import Path

import pytest

from maxkernel.analysis.program import trace_program
from maxkernel.templates.attention import FLASH_ATTENTION, analyse, plan
from maxkernel.templates.attention_layout import find_layout
from support import task_folder

YAML = """\
id: {id}
name: {id}
category: attention
description: attention written for the layout tests.
dtype: float32
tolerance: {{atol: 1.0e-3, rtol: 1.0e-3}}
sizes:
  cpu: {{batch: 1, heads: 8, kv_heads: 2, seq: 256, head_dim: 64}}
  full: {{batch: 2, heads: 16, kv_heads: 4, seq: 2048, head_dim: 128}}
free: {{batch: {{}}}}
"""

# Values first, then queries, then keys; [batch, seq, heads, head_dim]; keys and values repeated per group;
# a sliding causal window filled with a large negative number, the scale computed from a constant.
BSHD = '''\
import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, heads, kv_heads, seq, head_dim):
    k1, k2, k3 = jax.random.split(key, 3)
    vals = jax.random.normal(k1, (batch, seq, kv_heads, head_dim), jnp.float32)
    qs = jax.random.normal(k2, (batch, seq, heads, head_dim), jnp.float32)
    ks = jax.random.normal(k3, (batch, seq, kv_heads, head_dim), jnp.float32)
    return (vals, qs, ks), {"window": 96}


def reference(vals, qs, ks, *, window):
    rep = qs.shape[2] // ks.shape[2]
    ks = jnp.repeat(ks, rep, axis=2)
    vals = jnp.repeat(vals, rep, axis=2)
    s = jnp.einsum("bqhd,bkhd->bhqk", qs, ks) / jnp.sqrt(jnp.float32(qs.shape[-1]))
    i = jnp.arange(s.shape[-1])[:, None]
    j = jnp.arange(s.shape[-1])[None, :]
    s = jnp.where((j <= i) & (i - j < window), s, -1e30)
    p = jax.nn.softmax(s, axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", p, vals)
'''

# A near miss: the keys tiled over the heads (query head h reads kv head h % kv_heads), not repeated.
TILED = BSHD.replace("jnp.repeat(ks, rep, axis=2)", "jnp.tile(ks, (1, 1, rep, 1))").replace(
    "jnp.repeat(vals, rep, axis=2)", "jnp.tile(vals, (1, 1, rep, 1))")


# A bias over (heads, query, key) read whole, block by block; no mask.
BIASED = BSHD.replace('return (vals, qs, ks), {"window": 96}', 'return (vals, qs, ks, jax.random.normal(k1, (heads, seq, seq))), {}').replace(
    "def reference(vals, qs, ks, *, window):", "def reference(vals, qs, ks, bias):").replace(
    "s = jnp.where((j <= i) & (i - j < window), s, -1e30)", "s = s + bias")


# Already [batch, heads, seq, head_dim] and in order, the kv heads repeated over the query heads.
BHSD_REPEAT = '''\
import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, heads, kv_heads, seq, head_dim):
    k1, k2, k3 = jax.random.split(key, 3)
    return (jax.random.normal(k1, (batch, heads, seq, head_dim), jnp.float32),
            jax.random.normal(k2, (batch, kv_heads, seq, head_dim), jnp.float32),
            jax.random.normal(k3, (batch, kv_heads, seq, head_dim), jnp.float32)), {}


def reference(q, k, v):
    rep = q.shape[1] // k.shape[1]
    s = jnp.einsum("bhqd,bhkd->bhqk", q, jnp.repeat(k, rep, axis=1)) * q.shape[-1] ** -0.5
    return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(s, axis=-1), jnp.repeat(v, rep, axis=1))
'''


def _task(tmp_path: Path, name: str, source: str):  # type: ignore[no-untyped-def]
    return task_folder(tmp_path, name, YAML.format(id=name), source)


def test_roles_and_axes_are_read_by_data_flow(tmp_path: Path) -> None:
    layout = find_layout(trace_program(_task(tmp_path, "bshd", BSHD), "cpu").dce())
    assert not isinstance(layout, str), layout
    assert layout.order == (1, 2, 0)  # queries, keys, values, wherever they are among the arguments
    assert layout.perms == ((0, 2, 1, 3),) * 3 and layout.out_perm == (0, 2, 1, 3)
    shape = analyse(_task(tmp_path, "again", BSHD), "cpu")
    assert not isinstance(shape, str), shape
    assert (shape.q_heads, shape.kv_heads, shape.seq_q, shape.head_dim) == (8, 2, 256, 64)


def test_the_moved_kernel_is_the_flash_kernel_with_a_wrapper(tmp_path: Path) -> None:
    task = _task(tmp_path, "bshd", BSHD)
    found = plan(task, ("cpu", "full"))
    assert not isinstance(found, str), found
    assert found.mask is not None and "window" in found.mask.description
    source = FLASH_ATTENTION.render(task, {"block_q": 256, "block_k": 256}, ("cpu", "full"))
    assert "def kernel(vals, qs, ks, *, window):" in source
    assert "qs_bhsd = jnp.transpose(qs, (0, 2, 1, 3))" in source
    assert "_flash_attention(qs_bhsd, ks_bhsd, vals_bhsd, window=window)" in source


def test_a_bias_over_heads_queries_and_keys_is_read_block_by_block(tmp_path: Path) -> None:
    task = _task(tmp_path, "biased", BIASED)
    found = plan(task, ("cpu", "full"))
    assert not isinstance(found, str), found
    assert found.bias == "bias" and found.dense == (1, 2, 3) and found.mask is None
    source = FLASH_ATTENTION.render(task, {"block_q": 256, "block_k": 128}, ("cpu", "full"))
    assert "def kernel(vals, qs, ks, bias):" in source and "s = s + bias_ref[h].astype(jnp.float32)" in source
    assert "lambda b, g, t, qb, kb, f: (g, qb[t], kb[t])" in source


def test_keys_repeated_over_the_heads_in_the_kernel_s_own_layout_need_no_wrapper(tmp_path: Path) -> None:
    task = _task(tmp_path, "repeat", BHSD_REPEAT)
    found = plan(task, ("cpu", "full"))
    assert not isinstance(found, str), found
    assert found.layout is None
    source = FLASH_ATTENTION.render(task, {"block_q": 256, "block_k": 256}, ("cpu", "full"))
    assert "def kernel(q, k, v):" in source and "jnp.transpose" not in source


def test_keys_tiled_over_the_heads_are_not_taken_for_a_repeat(tmp_path: Path) -> None:
    assert isinstance(plan(_task(tmp_path, "tiled", TILED), ("cpu",)), str)


@pytest.mark.slow
@pytest.mark.parametrize("name,reference,blocks", [("bshd", BSHD, {"block_q": 256, "block_k": 256}),
                                                   ("biased", BIASED, {"block_q": 256, "block_k": 128})])
def test_the_moved_kernel_checks_correct_and_is_priced_on_tpu_v6e(tmp_path: Path, name: str, reference: str,
                                                                  blocks: dict[str, int]) -> None:
    from maxkernel.evaluation import evaluate_candidate

    task = _task(tmp_path, name, reference)
    source = FLASH_ATTENTION.render(task, blocks, ("cpu", "full"))
    report = evaluate_candidate(task, source, target="tpu-v6e")
    assert report.status == "ok", report.reason
    assert report.label == "pallas-kernel" and report.speedup is not None and report.speedup > 1.0


# The kernel's own layout, its output gated elementwise (o * sigmoid(o)) and scaled: an attention the flash kernel
# serves only with what follows it; a near miss sums the output over the head dimension instead.
GATED = BHSD_REPEAT.replace(
    "    return jnp.einsum(\"bhqk,bhkd->bhqd\", jax.nn.softmax(s, axis=-1), jnp.repeat(v, rep, axis=1))",
    "    o = jnp.einsum(\"bhqk,bhkd->bhqd\", jax.nn.softmax(s, axis=-1), jnp.repeat(v, rep, axis=1))\n"
    "    return 0.5 * (o * jax.nn.sigmoid(o))")
SUMMED = GATED.replace("jnp.repeat(k, rep, axis=1)", "k").replace("jnp.repeat(v, rep, axis=1)", "v").replace(
    "kv_heads, seq, head_dim), jnp.float32)", "heads, seq, head_dim), jnp.float32)").replace(
    "return 0.5 * (o * jax.nn.sigmoid(o))", "return o.sum(-1, keepdims=True) * jnp.ones_like(o)")


def test_an_output_gate_after_the_attention_runs_on_the_kernel_s_result(tmp_path: Path) -> None:
    # The flash template matched the attention and left out what followed it: a suite task with its output
    # gated (a variant of 4p) got an incorrect kernel. Now the gate is the kernel's tail, run by XLA.
    task = _task(tmp_path, "gated", GATED)
    found = analyse(task, "cpu")
    assert not isinstance(found, str) and found.tail is not None
    assert {"logistic", "mul"} <= set(found.tail.primitives())
    source = FLASH_ATTENTION.render(task, {"block_q": 128, "block_k": 128}, ("cpu", "full"))
    assert "def _tail(" in source and "return _tail(_attention(q, k, v, **static))" in source
    plain = _task(tmp_path, "plain", BHSD_REPEAT)
    assert analyse(plain, "cpu").tail is None  # type: ignore[union-attr]
    assert "_tail" not in FLASH_ATTENTION.render(plain, {"block_q": 128, "block_k": 128}, ("cpu", "full"))


def test_a_reduction_after_the_attention_is_left_to_xla_after_the_core(tmp_path: Path) -> None:
    """Not the kernel's tail (only elementwise ops are): the attention is cut as a core, and the sum runs in
    XLA on the kernel's result."""
    found = analyse(_task(tmp_path, "summed", SUMMED), "cpu")
    assert not isinstance(found, str) and found.tail is None and found.around is not None
    assert "reduce_sum" in found.around.after.primitives()


@pytest.mark.slow
def test_the_gated_attention_checks_correct_on_tpu_v6e(tmp_path: Path) -> None:
    from maxkernel.evaluation import evaluate_candidate

    task = _task(tmp_path, "gated_eval", GATED)
    source = FLASH_ATTENTION.render(task, {"block_q": 256, "block_k": 256}, ("cpu", "full"))
    report = evaluate_candidate(task, source, target="tpu-v6e")
    assert report.status == "ok" and report.label == "pallas-kernel", report.reason


# The kernel's own layout under a leading axis of one, the attention mapped over it with jax.vmap (how a
# caller adds a batch of one): every array is five-dimensional and the matmuls batch over three axes.
MAPPED = '''\
import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, heads, kv_heads, seq, head_dim):
    k1, k2, k3 = jax.random.split(key, 3)
    return (jax.random.normal(k1, (1, batch, heads, seq, head_dim), jnp.float32),
            jax.random.normal(k2, (1, batch, heads, seq, head_dim), jnp.float32),
            jax.random.normal(k3, (1, batch, heads, seq, head_dim), jnp.float32)), {}


def _attention(q, k, v):
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k) / jnp.sqrt(jnp.float32(q.shape[-1]))
    causal = jnp.arange(s.shape[-1])[None, :] <= jnp.arange(s.shape[-2])[:, None]
    return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(jnp.where(causal, s, -jnp.inf), axis=-1), v)


def reference(q, k, v):
    return jax.vmap(_attention)(q, k, v)
'''


def test_an_attention_mapped_over_an_axis_of_one_is_served_with_that_axis_dropped(tmp_path: Path) -> None:
    # A suite attention under a leading axis of one (the variants' batch_added) got nothing: the layout
    # reader wanted four-dimensional arguments.
    task = _task(tmp_path, "mapped", MAPPED)
    layout = find_layout(trace_program(task, "cpu").dce())
    assert not isinstance(layout, str), layout
    assert layout.units == (0, 0, 0) and layout.out_perm == (-1, 0, 1, 2, 3)
    assert not isinstance(analyse(task, "cpu"), str) and not isinstance(analyse(task, "full"), str)
    source = FLASH_ATTENTION.render(task, {"block_q": 128, "block_k": 128}, ("cpu", "full"))
    assert "q_bhsd = jnp.squeeze(q, 0)" in source and "return jnp.expand_dims(_flash_attention(" in source


@pytest.mark.slow
def test_the_mapped_attention_checks_correct_on_tpu_v6e(tmp_path: Path) -> None:
    from maxkernel.evaluation import evaluate_candidate

    task = _task(tmp_path, "mapped_eval", MAPPED)
    source = FLASH_ATTENTION.render(task, {"block_q": 256, "block_k": 256}, ("cpu", "full"))
    report = evaluate_candidate(task, source, target="tpu-v6e")
    assert report.status == "ok" and report.label == "pallas-kernel", report.reason


# The kernel's layout with the batch merged into the heads: [batch * heads, seq, head_dim] arguments, split
# inside the reference by a static batch count that the mask never reads, the output merged back.
MERGED = '''\
import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, heads, kv_heads, seq, head_dim):
    k1, k2, k3 = jax.random.split(key, 3)
    shape = (batch * heads, seq, head_dim)
    return (jax.random.normal(k1, shape, jnp.float32), jax.random.normal(k2, shape, jnp.float32),
            jax.random.normal(k3, shape, jnp.float32)), {"batch_count": batch}


def reference(q, k, v, *, batch_count):
    q, k, v = (t.reshape(batch_count, -1, *t.shape[1:]) for t in (q, k, v))
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k) / jnp.sqrt(jnp.float32(q.shape[-1]))
    causal = jnp.arange(s.shape[-1])[None, :] <= jnp.arange(s.shape[-2])[:, None]
    out = jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(jnp.where(causal, s, -jnp.inf), axis=-1), v)
    return out.reshape(-1, *out.shape[2:])
'''


def test_an_attention_over_merged_batch_and_heads_is_served_with_a_heads_axis_of_one(tmp_path: Path) -> None:
    # A suite attention with its batch merged into the heads (the variants' batch_removed) got nothing: the
    # layout reader wanted four-dimensional arguments; and a static the mask never reads reached the mask.
    task = _task(tmp_path, "merged", MERGED)
    layout = find_layout(trace_program(task, "full").dce())
    assert not isinstance(layout, str), layout
    assert layout.perms == ((0, -1, 1, 2),) * 3 and layout.out_perm == (0, 2, 3)
    assert not isinstance(analyse(task, "cpu"), str) and not isinstance(analyse(task, "full"), str)
    source = FLASH_ATTENTION.render(task, {"block_q": 128, "block_k": 128}, ("cpu", "full"))
    assert "q_bhsd = jnp.expand_dims(q, 1)" in source
    assert "return jnp.squeeze(_flash_attention(q_bhsd, k_bhsd, v_bhsd, batch_count=batch_count), 1)" in source
    assert "_visible(rows, cols)" in source  # the mask is causal: it takes no static


@pytest.mark.slow
def test_the_merged_attention_checks_correct_on_tpu_v6e(tmp_path: Path) -> None:
    from maxkernel.evaluation import evaluate_candidate

    task = _task(tmp_path, "merged_eval", MERGED)
    source = FLASH_ATTENTION.render(task, {"block_q": 256, "block_k": 256}, ("cpu", "full"))
    report = evaluate_candidate(task, source, target="tpu-v6e")
    assert report.status == "ok" and report.label == "pallas-kernel", report.reason
