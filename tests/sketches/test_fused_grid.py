"""The general rules (``fused_grid``) read computations by data flow: the same computation written another
way (argument order, names, spelling) gets the same grid; near misses (the same ops without the structure)
do not; and what they emit lowers for TPU, checks correct and is priced."""

from __future__ import annotations

from pathlib import Path

import pytest

from jaxbench.task import load_task
from maxkernel.sketches.fused import FUSED_GRID, plan

YAML = """\
id: {id}
name: {id}
category: reduction
description: a computation written for the general rules' tests.
dtype: {dtype}
tolerance: {{atol: {tol}, rtol: {tol}}}
sizes:
  cpu: {cpu}
  full: {full}
free: {{{free}: {{}}}}
"""

LAYERNORM = '''\
import jax
import jax.numpy as jnp


def get_inputs(key, *, tokens, hidden):
    k1, k2 = jax.random.split(key)
    x = jax.random.normal(k1, (tokens, hidden), jnp.float32)
    return (x, 1.0 + 0.1 * jax.random.normal(k2, (hidden,), jnp.float32)), {}


def reference(x, gamma):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) * jax.lax.rsqrt(var + 1e-5) * gamma
'''

# The same norm: the scale first, the statistics spelled as sums, a different name for everything.
LAYERNORM_OTHER = '''\
import jax
import jax.numpy as jnp


def get_inputs(key, *, tokens, hidden):
    k1, k2 = jax.random.split(key)
    acts = jax.random.normal(k1, (tokens, hidden), jnp.float32)
    return (1.0 + 0.1 * jax.random.normal(k2, (hidden,), jnp.float32), acts), {}


def reference(scale, acts):
    n = acts.shape[1]
    centred = acts - jnp.sum(acts, axis=1)[:, None] / n
    return scale[None, :] * centred / jnp.sqrt(jnp.sum(centred * centred, axis=1)[:, None] / n + 1e-5)
'''

# A near miss: the same ops, statistics over the batch (axis 0): rows are not independent, columns are.
BATCH_STATS = LAYERNORM.replace("x.mean(-1, keepdims=True)", "x.mean(0, keepdims=True)").replace(
    "((x - mu) ** 2).mean(-1, keepdims=True)", "((x - mu) ** 2).mean(0, keepdims=True)")

DEQUANT = '''\
import jax
import jax.numpy as jnp


def get_inputs(key, *, m, k, n):
    k1, k2, k3 = jax.random.split(key, 3)
    scales = jax.random.uniform(k3, (n,), jnp.float32, 0.5, 1.5) / (127.0 * k ** 0.5)
    q = jax.random.randint(k2, (k, n), -127, 128, dtype=jnp.int32).astype(jnp.int8)
    a = jax.random.normal(k1, (m, k), jnp.float32).astype(jnp.bfloat16)
    return (scales, q, a), {}


def reference(scales, q, a):
    acc = jnp.dot(a, q.astype(jnp.bfloat16), preferred_element_type=jnp.float32)
    return (acc * scales).astype(jnp.bfloat16)
'''

# A near miss for the split: a norm over the contracted axis before the matmul.
NORMED = '''\
import jax
import jax.numpy as jnp


def get_inputs(key, *, m, k, n):
    k1, k2 = jax.random.split(key)
    a = jax.random.normal(k1, (m, k), jnp.float32).astype(jnp.bfloat16)
    w = (jax.random.normal(k2, (k, n), jnp.float32) / k ** 0.5).astype(jnp.bfloat16)
    return (a, w), {}


def reference(a, w):
    af = a.astype(jnp.float32)
    h = (af * jax.lax.rsqrt(jnp.mean(af * af, axis=-1, keepdims=True) + 1e-6)).astype(jnp.bfloat16)
    return jnp.dot(h, w, preferred_element_type=jnp.float32).astype(jnp.bfloat16)
'''

MASKED = '''\
import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, rows, cols):
    k1, k2 = jax.random.split(key)
    keep = jax.random.bernoulli(k2, 0.9, (batch, cols)).at[:, 0].set(True)
    return (keep, jax.random.normal(k1, (batch, rows, cols), jnp.float32)), {"temperature": 0.5}


def reference(keep, logits, temperature):
    z = jnp.where(keep[:, None, :], logits / temperature, -jnp.inf)
    return jax.nn.softmax(z, axis=-1)
'''

XENT = '''\
import jax
import jax.numpy as jnp


def get_inputs(key, *, tokens, vocab):
    k1, k2 = jax.random.split(key)
    labels = jax.random.randint(k2, (tokens,), 0, vocab, dtype=jnp.int32)
    return (labels, jax.random.normal(k1, (tokens, vocab), jnp.float32).astype(jnp.bfloat16)), {}


def reference(labels, logits):
    lp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.take_along_axis(lp, labels[:, None], axis=-1)[:, 0]
'''

# A near miss for the one-hot pick: the index picks a row, not an element of each row.
ROW_PICK = XENT.replace("-jnp.take_along_axis(lp, labels[:, None], axis=-1)[:, 0]", "lp[labels]")

# An associative scan: its even/odd slices are strided and its interleave pads between elements.
RECURRENCE = '''\
import jax
import jax.numpy as jnp


def get_inputs(key, *, tokens, hidden):
    k1, k2 = jax.random.split(key)
    return (jax.random.normal(k1, (tokens, hidden), jnp.float32), jax.random.normal(k2, (tokens, hidden), jnp.float32)), {}


def reference(gate, x):
    a = jax.nn.sigmoid(gate)
    def combine(left, right):
        return left[0] * right[0], right[0] * left[1] + right[1]
    return jax.lax.associative_scan(combine, (a, (1.0 - a) * x), axis=0)[1]
'''

# Empty pieces joined to full ones: an empty slice concatenated is no value a kernel must hold.
EMPTY_JOIN = '''\
import jax
import jax.numpy as jnp


def get_inputs(key, *, tokens, hidden):
    return (jax.random.normal(key, (tokens, hidden), jnp.float32),), {}


def reference(x):
    none = jax.lax.slice(x, (0, 0), (x.shape[0], 0))
    return jnp.tanh(jnp.concatenate([none * 2.0, x, none], axis=1))
'''

ROUTER = '''\
import jax
import jax.numpy as jnp


def get_inputs(key, *, tokens, hidden):
    k1, k2 = jax.random.split(key)
    return (jax.random.normal(k2, (hidden, 64), jnp.float32) / hidden ** 0.5,
            jax.random.normal(k1, (tokens, hidden), jnp.float32)), {"k": 4}


def reference(w, x, *, k):
    probs = jax.nn.softmax(jnp.dot(x, w, precision=jax.lax.Precision.HIGHEST), axis=-1)
    top, idx = jax.lax.top_k(probs, k)
    top = top / jnp.sum(top, axis=-1, keepdims=True)
    return jnp.zeros_like(probs).at[jnp.arange(probs.shape[0])[:, None], idx].set(top)
'''

# A near miss: the same top-k straight on the inputs, with no contraction or reduction before it.
ROUTER_BARE = ROUTER.replace("jax.nn.softmax(jnp.dot(x, w, precision=jax.lax.Precision.HIGHEST), axis=-1)",
                             "jnp.abs(x[:, :64] + w[0, :64])")

CONV = '''\
import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, length, channels):
    k1, k2 = jax.random.split(key)
    return (jax.random.normal(k1, (batch, channels, length), jnp.float32),
            0.3 * jax.random.normal(k2, (channels, 1, 4), jnp.float32)), {}


def reference(x, w):
    y = jax.lax.conv_general_dilated(x, w, window_strides=(1,), padding=[(3, 0)],
                                     dimension_numbers=("NCW", "OIW", "NCW"), feature_group_count=x.shape[1])
    return jax.nn.silu(y)
'''

CONV_SIZES = dict(cpu="{batch: 2, length: 512, channels: 256}", full="{batch: 8, length: 4096, channels: 2048}",
                  free="batch", dtype="float32", tol="1.0e-4")

ROWS = dict(cpu="{tokens: 256, hidden: 512}", full="{tokens: 8192, hidden: 4096}", free="tokens", dtype="float32", tol="1.0e-5")
GEMM = dict(cpu="{m: 128, k: 1024, n: 512}", full="{m: 2048, k: 8192, n: 8192}", free="m", dtype="bfloat16", tol="2.0e-2")
LOSS = dict(cpu="{tokens: 128, vocab: 4096}", full="{tokens: 8192, vocab: 131072}", free="tokens", dtype="bfloat16",
            tol="1.0e-3")
SOFTMAX = dict(cpu="{batch: 2, rows: 64, cols: 1024}", full="{batch: 16, rows: 256, cols: 32768}", free="rows",
               dtype="float32", tol="1.0e-5")


def _task(tmp_path: Path, name: str, source: str, sizes: dict[str, str]):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "task.yaml").write_text(YAML.format(id=name, **sizes))
    (folder / "reference.py").write_text(source)
    return load_task(folder)


def _grid(task) -> list[tuple[str, int, tuple, bool]]:
    p = plan(task, ("cpu", "full"))
    assert not isinstance(p, str), p
    return [(g.name, g.extent, g.in_axes, g.reduction) for g in p.grid]


def test_a_norm_is_gridded_over_its_rows_however_it_is_written(tmp_path: Path) -> None:
    one = _grid(_task(tmp_path, "ln", LAYERNORM, ROWS))
    other = _grid(_task(tmp_path, "ln_other", LAYERNORM_OTHER, ROWS))
    assert one == [("tokens", 8192, (0, None), False)]
    assert other == [("tokens", 8192, (None, 0), False)]  # the same axis, found in the second argument


def test_a_stack_keeps_the_axes_it_does_not_join(tmp_path: Path) -> None:
    stacked = LAYERNORM.replace("    return (x - mu) * jax.lax.rsqrt(var + 1e-5) * gamma",
                                "    pair = jnp.stack([x - mu, (x - mu) * gamma], axis=1)\n"
                                "    return pair[:, 0, :] * jax.lax.rsqrt(var + 1e-5) + pair[:, 1, :]")
    assert _grid(_task(tmp_path, "stacked", stacked, ROWS)) == [("tokens", 8192, (0, None), False)]


def test_statistics_over_the_batch_grid_the_columns_not_the_rows(tmp_path: Path) -> None:
    assert _grid(_task(tmp_path, "bn", BATCH_STATS, ROWS)) == [("hidden", 4096, (1, 0), False)]


def test_a_dequantizing_matmul_splits_its_contraction_and_a_normed_one_does_not(tmp_path: Path) -> None:
    dequant = _grid(_task(tmp_path, "dq", DEQUANT, GEMM))
    assert [(g[1], g[2], g[3]) for g in dequant] == [(2048, (None, None, 0), False), (8192, (0, 1, None), False),
                                                     (8192, (None, 0, 1), True)]
    normed = _grid(_task(tmp_path, "nm", NORMED, GEMM))
    assert all(not g[3] for g in normed)  # the norm reduces over the contracted axis: read whole
    assert [(g[1], g[2]) for g in normed] == [(2048, (0, None)), (8192, (None, 1))]


def test_a_norm_before_a_projection_is_computed_once_per_row_block(tmp_path: Path) -> None:
    task = _task(tmp_path, "nm", NORMED, GEMM)
    p = plan(task, ("cpu", "full"))
    assert not isinstance(p, str) and list(p.hoists) == ["w_dim1"]  # only when the columns run innermost
    params = {**FUSED_GRID.space(task, None, "tpu-v6e").defaults, "grid_order": "outputs", "hoist": True}  # type: ignore[arg-type]
    source = FUSED_GRID.render(task, params, ("cpu", "full"))
    assert "def _prologue(a):" in source and "def _main(h, w):" in source and "jax.lax.rsqrt" in source
    assert '"parallel", "arbitrary"' in source and "@pl.when(pl.program_id(1) == 0)" in source


def test_the_emitted_kernel_reads_like_the_reference(tmp_path: Path) -> None:
    task = _task(tmp_path, "dq", DEQUANT, GEMM)
    space = FUSED_GRID.space(task, None, "tpu-v6e")  # type: ignore[arg-type]
    source = FUSED_GRID.render(task, space.defaults, ("cpu", "full"))
    assert "def kernel(scales, q, a, **static):" in source
    assert "def _partial(q, a):" in source and "q.astype(jnp.bfloat16)" in source
    assert '"parallel", "parallel", "arbitrary"' in source and "scratch_shapes=[pltpu.VMEM(" in source
    assert "interpret" not in source
    for name, value in space.defaults.items():
        if name.startswith("block_"):
            assert f"{name.upper()} = {value}" in source


def test_a_boolean_mask_read_whole_per_batch_travels_lifted(tmp_path: Path) -> None:
    task = _task(tmp_path, "ms", MASKED, SOFTMAX)
    assert [(g[0], g[2]) for g in _grid(task)] == [("batch", (0, 0)), ("rows", (None, 1))]
    source = FUSED_GRID.render(task, {"block_batch": 1, "block_rows": 64}, ("cpu", "full"))
    assert ")(keep.reshape(keep.shape[:-1] + (1, keep.shape[-1])), logits)" in source


def test_a_boolean_mask_travels_as_it_is_stored_with_no_xla_conversion_around_the_kernel(tmp_path: Path) -> None:
    """Mosaic loads booleans a byte each: a conversion to a wider integer before the kernel would be an XLA
    pass writing the mask again at four times its size, and the kernel would read that."""
    from maxkernel.targets import validate_tpu
    from maxkernel.targets.model import model_candidate

    task = _task(tmp_path, "ms", MASKED, SOFTMAX)
    source = FUSED_GRID.render(task, FUSED_GRID.space(task, None, "tpu-v6e").defaults, ("cpu", "full"))  # type: ignore[arg-type]
    assert ".astype(jnp.int" not in source and "!= 0" not in source
    result = validate_tpu(source, task, "v6e")
    assert result.ok, result.reason
    estimate = model_candidate(source, task, "v6e")
    assert [k.name for k in estimate.kernels] == ["_fused_kernel"]
    assert not any("XLA code around the kernels" in note for note in estimate.notes)


def test_a_per_row_pick_by_label_becomes_a_one_hot_sum_and_a_row_pick_does_not(tmp_path: Path) -> None:
    task = _task(tmp_path, "xe", XENT, LOSS)
    assert [(g[0], g[2]) for g in _grid(task)] == [("tokens", (0, 0))]
    source = FUSED_GRID.render(task, FUSED_GRID.space(task, None, "tpu-v6e").defaults, ("cpu", "full"))  # type: ignore[arg-type]
    assert "jax.lax.gather" not in source and "jax.lax.broadcasted_iota(jnp.int32" in source
    assert "labels.reshape(-1, 1)" in source  # the split vector travels as a column
    row_pick = plan(_task(tmp_path, "rp", ROW_PICK, LOSS), ("cpu", "full"))  # a row picked: no one-hot, left to XLA
    assert not isinstance(row_pick, str) and row_pick.tail is not None
    assert "gather" in row_pick.tail.program.primitives() and "gather" not in row_pick.program.primitives()


def test_what_mosaic_cannot_lower_is_refused_with_its_reason_and_empty_pieces_are_dropped(tmp_path: Path) -> None:
    assert plan(_task(tmp_path, "rec", RECURRENCE, ROWS), ("cpu", "full")) == (
        "a strided slice in the reference (Mosaic slices values with unit strides only)")
    task = _task(tmp_path, "empty", EMPTY_JOIN, ROWS)
    p = plan(task, ("cpu", "full"))
    assert not isinstance(p, str), p
    assert all(int(d) > 0 for n in p.program.nodes for v in n.outs for d in v.shape)
    source = FUSED_GRID.render(task, FUSED_GRID.space(task, None, "tpu-v6e").defaults, ("cpu", "full"))  # type: ignore[arg-type]
    assert "jax.lax.slice" not in source and "jnp.tanh" in source


def test_a_top_k_and_what_follows_it_are_left_to_xla_after_the_kernel(tmp_path: Path) -> None:
    task = _task(tmp_path, "router", ROUTER, ROWS)
    p = plan(task, ("cpu", "full"))
    assert not isinstance(p, str), p
    assert "dot_general" in p.program.primitives() and "top_k" not in p.program.primitives()
    assert p.tail is not None and {"top_k", "scatter"} <= set(p.tail.program.primitives())
    source = FUSED_GRID.render(task, FUSED_GRID.space(task, None, "tpu-v6e").defaults, ("cpu", "full"))  # type: ignore[arg-type]
    assert "def _after(" in source and "jax.lax.top_k(" in source and "jax.lax.scatter(" in source
    assert plan(_task(tmp_path, "bare", ROUTER_BARE, ROWS), ("cpu", "full")) == (
        "top_k in the reference, with no contraction or reduction before it to write a kernel for")


def test_a_depthwise_convolution_becomes_taps_over_its_parallel_channels(tmp_path: Path) -> None:
    task = _task(tmp_path, "conv", CONV, CONV_SIZES)
    assert [(g[0], g[2]) for g in _grid(task)] == [("batch", (0, None)), ("channels", (1, 0))]
    source = FUSED_GRID.render(task, FUSED_GRID.space(task, None, "tpu-v6e").defaults, ("cpu", "full"))  # type: ignore[arg-type]
    assert "conv_general_dilated" not in source and "jax.lax.pad(" in source and "kernel's taps" in source
    strided = _task(tmp_path, "strided", CONV.replace("window_strides=(1,)", "window_strides=(2,)"), CONV_SIZES)
    assert plan(strided, ("cpu", "full")) == (
        "conv_general_dilated in the reference, with no contraction or reduction before it to write a kernel for")


def test_a_projection_split_into_heads_reads_the_head_count_from_its_static_argument(tmp_path: Path) -> None:
    heads = NORMED.replace("return (a, w), {}", 'return (a, w), {"heads": 16}').replace(
        "def reference(a, w):", "def reference(a, w, *, heads):").replace(
        "preferred_element_type=jnp.float32).astype(jnp.bfloat16)",
        "preferred_element_type=jnp.float32).astype(jnp.bfloat16).reshape(a.shape[0], heads, -1)")
    task = _task(tmp_path, "heads", heads, GEMM)
    source = FUSED_GRID.render(task, FUSED_GRID.space(task, None, "tpu-v6e").defaults, ("cpu", "full"))  # type: ignore[arg-type]
    assert 'reshape(value0.shape[:1] + (static["heads"], -1))' in source  # not the 16 it was traced with
    assert "_after_for(key)(results[0].reshape(outs[0].shape), static)" in source


def test_a_mean_over_the_rows_is_left_to_xla_after_the_kernel(tmp_path: Path) -> None:
    loss = XENT.replace("    return -jnp.take_along_axis(lp, labels[:, None], axis=-1)[:, 0]",
                        "    nll = -jnp.take_along_axis(lp, labels[:, None], axis=-1)[:, 0]\n"
                        "    return nll.astype(logits.dtype), jnp.mean(nll)")
    task = _task(tmp_path, "lm", loss, LOSS)
    p = plan(task, ("cpu", "full"))
    assert not isinstance(p, str) and p.tail is not None
    assert p.tail.places == (("kernel", 0), ("after", 0))  # the per-token losses from the kernel, the mean after
    assert [o.shape for o in p.outputs] == [(8192,), (8192,)]  # the float32 losses the mean reads, written too
    source = FUSED_GRID.render(task, FUSED_GRID.space(task, None, "tpu-v6e").defaults, ("cpu", "full"))  # type: ignore[arg-type]
    assert "def _after(nll):" in source and "after = _after_for(key)(results[1]" in source


@pytest.mark.slow
@pytest.mark.parametrize("name,source,sizes", [("dq", DEQUANT, GEMM), ("ms", MASKED, SOFTMAX), ("ln", LAYERNORM_OTHER, ROWS),
                                               ("xe", XENT, LOSS), ("nm", NORMED, GEMM), ("router", ROUTER, ROWS),
                                               ("conv", CONV, CONV_SIZES)])
def test_the_general_kernel_lowers_checks_and_is_priced_on_tpu_v6e(tmp_path: Path, name: str, source: str,
                                                                   sizes: dict[str, str]) -> None:
    from maxkernel.evaluation import evaluate_candidate

    task = _task(tmp_path, name, source, sizes)
    candidate = FUSED_GRID.render(task, FUSED_GRID.space(task, None, "tpu-v6e").defaults, ("cpu", "full"))  # type: ignore[arg-type]
    report = evaluate_candidate(task, candidate, target="tpu-v6e")
    assert report.status == "ok", report.reason
    assert report.label == "pallas-kernel" and report.basis == "modelled" and report.speedup is not None


def test_a_batch_of_one_reshaped_away_at_one_size_is_refused_with_its_reason(tmp_path: Path) -> None:
    # The suite's flash attention with its batch merged into the heads: at the cpu size (a batch of one) the
    # arrays have another rank than at full, and reading the full size's grid there raised IndexError,
    # which ended the planner (the session tried nothing).
    from jaxbench.task import list_tasks
    from jaxbench.variants import derive
    from maxkernel.analysis import analyze_task

    flash = next(t for t in list_tasks() if t.id.startswith("1p_"))
    task = load_task(derive(flash, "batch_removed", tmp_path, seed=1))
    assert FUSED_GRID.applies(task, analyze_task(task, "tpu-v6e")) == \
        "the arrays' ranks change with size (a batch of one reshaped away)"


GELU_LSE_BF16 = '''\
import jax
import jax.numpy as jnp


def get_inputs(key, *, tokens, hidden):
    return (jax.random.normal(key, (tokens, hidden), jnp.float32).astype(jnp.bfloat16),), {}


def reference(x):
    y = jax.nn.gelu(x, approximate=False)  # 0.5 x erfc(-x / sqrt 2)
    return jax.nn.logsumexp(y, axis=-1)  # its max is tested with isfinite
'''


def test_bfloat16_erfc_and_isfinite_are_written_as_mosaic_lowers_them(tmp_path: Path) -> None:
    """Mosaic lowers neither ``erfc`` nor a bfloat16 ``isfinite``: the general rules write ``1 - erf`` in
    float32 and test the float32 value; the kernel lowers for a TPU."""
    from maxkernel.targets import validate_tpu

    task = _task(tmp_path, "gelu_lse", GELU_LSE_BF16, {**ROWS, "dtype": "bfloat16", "tol": "5.0e-2"})
    source = FUSED_GRID.render(task, FUSED_GRID.space(task, None, "tpu-v6e").defaults, ("cpu", "full"))  # type: ignore[arg-type]
    assert "erfc" not in source and "jax.lax.erf(" in source
    result = validate_tpu(source, task, "v6e")
    assert result.ok, result.reason


# Rotary tables from an iota and a static: what the innermost axis does not change reads no input at all.
ROTARY = '''\
import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, seq, heads, dim):
    k1, k2 = jax.random.split(key)
    x = jax.random.normal(k1, (batch, seq, heads, dim), jnp.float32)
    where = jax.random.randint(k2, (batch, seq), 0, 4096, dtype=jnp.int32)
    return (x, where), {"base": 10000.0}


def reference(x, where, *, base):
    half = x.shape[-1] // 2
    freq = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angle = where.astype(jnp.float32)[..., None, None] * freq
    lo, hi = x[..., :half], x[..., half:]
    return jnp.concatenate([lo * jnp.cos(angle) - hi * jnp.sin(angle), hi * jnp.cos(angle) + lo * jnp.sin(angle)], -1)
'''
ROPE = dict(cpu="{batch: 2, seq: 256, heads: 4, dim: 128}", full="{batch: 4, seq: 4096, heads: 8, dim: 128}",
            free="batch", dtype="float32", tol="1.0e-4")


def test_a_prologue_that_reads_no_input_is_still_written_as_python(tmp_path: Path) -> None:
    import ast
    import itertools

    task = _task(tmp_path, "rotary", ROTARY, ROPE)
    space = FUSED_GRID.space(task, None, "tpu-v6e")  # type: ignore[arg-type]
    names = list(space.space)
    hoisted = 0
    for values in itertools.product(*(space.space[n] for n in names)):
        params = dict(zip(names, values))
        source = FUSED_GRID.render(task, params, ("cpu", "full"))
        ast.parse(source)  # every point of the space is Python
        hoisted += "def _prologue(*, base):" in source
    assert hoisted  # the point that hoists a prologue of statics alone was among them
