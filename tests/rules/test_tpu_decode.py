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
