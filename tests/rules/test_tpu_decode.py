"""Decode attention over a contiguous KV cache (one query token per sequence, GQA, per-sequence lengths) is
recognised by what it computes, whatever the argument names, order or cache layout, and its TPU kernel lowers,
checks correct at its check size and is priced."""

from __future__ import annotations

from pathlib import Path

import pytest

from jaxbench.task import load_task
from maxkernel.templates.tpu_decode import TpuDecodeTemplate, analyse

ROOT = Path(__file__).resolve().parents[2]
DECODE = ROOT / "benchmarks" / "generality_tasks" / "gqa_decode_attention"

# The same computation written otherwise: lengths first, values before keys, the cache [batch, kv_heads,
# cache_len, head_dim], the scale folded into the query, a jnp.where with -inf and a plain softmax.
REWRITTEN = '''\
import jax
import jax.numpy as jnp


def get_inputs(key, *, b, h, kvh, d, t):
    k1, k2, k3, k4 = jax.random.split(key, 4)
    lens = jax.random.randint(k4, (b,), 1, t + 1, dtype=jnp.int32)
    vals = jax.random.normal(k1, (b, kvh, t, d), jnp.float32).astype(jnp.bfloat16)
    keys = jax.random.normal(k2, (b, kvh, t, d), jnp.float32).astype(jnp.bfloat16)
    qry = jax.random.normal(k3, (b, h, d), jnp.float32).astype(jnp.bfloat16)
    return (lens, vals, keys, qry), {}


def reference(lens, vals, keys, qry):
    b, h, d = qry.shape
    kvh, t = keys.shape[1], keys.shape[2]
    q = (qry.astype(jnp.float32) / jnp.sqrt(d)).reshape(b, kvh, h // kvh, d)
    s = jnp.einsum("bngd,bntd->bngt", q, keys.astype(jnp.float32))
    s = jnp.where((jnp.arange(t) < lens[:, None])[:, None, None, :], s, -jnp.inf)
    out = jnp.einsum("bngt,bntd->bngd", jax.nn.softmax(s, axis=-1), vals.astype(jnp.float32))
    return out.reshape(b, h, d).astype(jnp.bfloat16)
'''
YAML = """\
id: decode_rewritten
name: DecodeRewritten
category: attention
description: decode attention, written otherwise.
dtype: bfloat16
tolerance: {atol: 2.0e-2, rtol: 2.0e-2}
sizes:
  cpu: {b: 4, h: 8, kvh: 2, d: 128, t: 1024}
  full: {b: 32, h: 32, kvh: 8, d: 128, t: 4096}
free: {b: {}}
"""


def test_decode_attention_is_matched_by_what_it_computes(tmp_path: Path) -> None:
    template = TpuDecodeTemplate()
    task = load_task(DECODE)
    assert template.applies(task, None) is None  # type: ignore[arg-type]
    a = analyse(task, "full")
    assert not isinstance(a, str)
    assert (a.q, a.k, a.v, a.lengths, a.layout, a.scaled) == (0, 1, 2, 3, "thd", True)
    assert (a.batch, a.q_heads, a.kv_heads, a.cache_len) == (64, 32, 8, 8192)

    folder = tmp_path / "decode_rewritten"
    folder.mkdir()
    (folder / "task.yaml").write_text(YAML)
    (folder / "reference.py").write_text(REWRITTEN)
    other = load_task(folder)
    b = analyse(other, "cpu")
    assert not isinstance(b, str)
    assert (b.q, b.k, b.v, b.lengths, b.layout, b.scaled) == (3, 2, 1, 0, "htd", True)
    source = template.render(other, template.space(other, None, "tpu-v6e").defaults, ("cpu", "full"))  # type: ignore[arg-type]
    assert "def kernel(lens, vals, keys, qry, **static):" in source and "k_slab, v_slab = keys, vals" in source

    # Attention with a query block (prefill) and a score bias is not decode attention.
    prefill = load_task(ROOT / "benchmarks" / "generality_tasks" / "biased_attention")
    assert template.applies(prefill, None) is not None  # type: ignore[arg-type]


@pytest.mark.slow
def test_the_decode_kernel_lowers_checks_and_is_priced_on_tpu_v6e() -> None:
    from maxkernel.evaluation import evaluate_candidate

    task = load_task(DECODE)
    template = TpuDecodeTemplate()
    source = template.render(task, template.space(task, None, "tpu-v6e").defaults, ("cpu", "full"))  # type: ignore[arg-type]
    report = evaluate_candidate(task, source, target="tpu-v6e")
    assert report.status == "ok", report.reason
    assert report.label == "pallas-kernel" and report.basis == "modelled" and report.speedup is not None
    assert any(c.name == "correct_unseen_size" and c.passed for c in report.checks)


# A sliding window that does not bind at the cpu size (the cache is no longer than the window there), with the
# window static among others: it must be found by what changing it does, never taken for no window.
WINDOWED = '''\
import jax
import jax.numpy as jnp


def get_inputs(key, *, b, h, kvh, d, t):
    k1, k2, k3, k4 = jax.random.split(key, 4)
    qry = jax.random.normal(k1, (b, h, d), jnp.float32)
    kc = jax.random.normal(k2, (b, t, kvh, d), jnp.float32)
    vc = jax.random.normal(k3, (b, t, kvh, d), jnp.float32)
    lens = jax.random.randint(k4, (b,), 1, t + 1, dtype=jnp.int32)
    return (qry, kc, vc, lens), {"groups_hint": 3, "span": 512}


def reference(qry, kc, vc, lens, *, groups_hint, span):
    b, h, d = qry.shape
    kvh = kc.shape[2]
    s = jnp.einsum("bngd,btnd->bngt", qry.reshape(b, kvh, h // kvh, d), kc) / jnp.sqrt(d)
    pos = jnp.arange(kc.shape[1])[None, :]
    keep = (pos < lens[:, None]) & (pos {cmp} lens[:, None] - span)
    s = jnp.where(keep[:, None, None, :], s, -jnp.inf)
    out = jnp.einsum("bngt,btnd->bngd", jax.nn.softmax(s, axis=-1), vc)
    return out.reshape(b, h, d)
'''


def _windowed(tmp_path: Path, name: str, cmp: str):  # type: ignore[no-untyped-def]
    from support import task_folder, task_yaml

    sizes = task_yaml(name, "attention", 1e-3, {"b": 4, "h": 8, "kvh": 2, "d": 128, "t": 512},
                      {"b": 16, "h": 16, "kvh": 4, "d": 128, "t": 4096}, "b")
    return task_folder(tmp_path, name, sizes, WINDOWED.replace("{cmp}", cmp))


def test_a_window_that_does_not_bind_at_the_probe_size_is_still_found(tmp_path: Path) -> None:
    template = TpuDecodeTemplate()
    task = _windowed(tmp_path, "decode_windowed", ">=")
    a = analyse(task, "full")
    assert not isinstance(a, str), a
    assert a.window == "span" and (a.q, a.k, a.v, a.lengths, a.layout) == (0, 1, 2, 3, "thd")
    source = template.render(task, template.space(task, None, "tpu-v6e").defaults, ("cpu", "full"))  # type: ignore[arg-type]
    assert 'window = static["span"]' in source and "(position >= length - window)" in source
    # The same kernel without the window would be wrong at sizes where it binds: the plain reading is refused.
    plain = analyse(load_task(DECODE), "cpu")
    assert not isinstance(plain, str) and plain.window is None

    # A near miss: the same ops with a window one position narrower (a strict comparison) is no reading the
    # template computes, so it is refused rather than rendered as either.
    near = _windowed(tmp_path, "decode_window_strict", ">")
    assert isinstance(analyse(near, "cpu"), str)


@pytest.mark.slow
def test_the_windowed_kernel_checks_correct_where_its_window_binds(tmp_path: Path) -> None:
    from maxkernel.evaluation import evaluate_candidate

    task = _windowed(tmp_path, "decode_windowed", ">=")
    template = TpuDecodeTemplate()
    source = template.render(task, template.space(task, None, "tpu-v6e").defaults, ("cpu", "full"))  # type: ignore[arg-type]
    report = evaluate_candidate(task, source, target="tpu-v6e")
    assert report.status == "ok", report.reason
    assert report.label == "pallas-kernel" and report.speedup is not None
