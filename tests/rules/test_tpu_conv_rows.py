"""The TPU convolution template on channels-last 1-D convolutions: the stride's phases on the lanes, each tap a
window of rows, correct in interpret mode at the declared and an unseen size, lowering for v6e."""

from __future__ import annotations

from pathlib import Path

import pytest

from jaxbench.task import load_task
from maxkernel.analysis import analyze_task
from maxkernel.rules.strategy import propose_strategies
from maxkernel.targets import validate_tpu
from maxkernel.templates.conv_rows import _tap_groups
from maxkernel.templates.tpu_conv import TPU_CONV, plan

YAML = """\
id: {id}
name: {id}
category: conv
description: a 1-D convolution written for the template's tests
dtype: {dtype}
tolerance:
  atol: {tol}
  rtol: {tol}
sizes:
  cpu:
    batch: 2
    length: {cpu_length}
    channels: {channels}
  full:
    batch: 8
    length: {full_length}
    channels: {channels}
free:
  batch: {{}}
"""

# A strided stem (stride 2, "SAME"), bias and exact GELU in bfloat16: what an audio model's first layer does.
STEM = '''\
import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, length, channels):
    k1, k2, k3 = jax.random.split(key, 3)
    x = jax.random.normal(k1, (batch, length, channels), jnp.float32).astype(jnp.bfloat16)
    w = (jax.random.normal(k2, (3, channels, channels), jnp.float32) * 0.05).astype(jnp.bfloat16)
    b = (0.1 * jax.random.normal(k3, (channels,), jnp.float32)).astype(jnp.bfloat16)
    return (x, w, b), {"stride": 2}


def reference(x, w, b, *, stride):
    y = jax.lax.conv_general_dilated(x, w, window_strides=(stride,), padding="SAME",
                                     dimension_numbers=("NWC", "WIO", "NWC"))
    return jax.nn.gelu(y + b, approximate=False)
'''

# The same stem with GELU written out in the convolution's dtype: the tail divides a bfloat16 value by a
# bfloat16 constant, so the kernel hands it the accumulator rounded to bfloat16, as the reference rounds.
STEM_WRITTEN_OUT = STEM.replace("    return jax.nn.gelu(y + b, approximate=False)\n",
                                "    y = y + b\n    return 0.5 * y * (1.0 + jax.lax.erf(y / jnp.sqrt(2.0).astype(y.dtype)))\n")

# Another spelling: the kernel stored [out, in, width], stride 3 over a length it does not divide, uneven
# explicit padding, float32, and a layer norm over the channels after it (XLA runs that tail).
THIRDS = '''\
import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, length, channels):
    k1, k2 = jax.random.split(key)
    seq = jax.random.normal(k1, (batch, length, channels), jnp.float32)
    kernel = jax.random.normal(k2, (channels, channels, 5), jnp.float32) * 0.05
    return (seq, kernel), {}


def reference(seq, kernel):
    h = jax.lax.conv_general_dilated(seq, kernel, (3,), [(2, 1)], dimension_numbers=("NWC", "OIW", "NWC"))
    mu = h.mean(axis=-1, keepdims=True)
    var = ((h - mu) ** 2).mean(axis=-1, keepdims=True)
    return (h - mu) * jax.lax.rsqrt(var + 1e-5)
'''

# Unit stride with a dilated kernel over 96 channels (not whole lanes), causal padding, ReLU.
DILATED = '''\
import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, length, channels):
    k1, k2 = jax.random.split(key)
    x = jax.random.normal(k1, (batch, length, channels), jnp.float32)
    w = jax.random.normal(k2, (3, channels, 2 * channels), jnp.float32) * 0.05
    return (x, w), {}


def reference(x, w):
    y = jax.lax.conv_general_dilated(x, w, (1,), [(4, 0)], rhs_dilation=(2,), dimension_numbers=("NWC", "WIO", "NWC"))
    return jnp.maximum(y, 0.0)
'''


def _task(tmp_path: Path, name: str, source: str, dtype: str = "float32", tol: str = "2.0e-2", channels: int = 128,
          cpu_length: int = 512, full_length: int = 16000):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "task.yaml").write_text(YAML.format(id=name, dtype=dtype, tol=tol, channels=channels,
                                                  cpu_length=cpu_length, full_length=full_length))
    (folder / "reference.py").write_text(source)
    return load_task(folder)


def _evaluate(task, source: str):  # type: ignore[no-untyped-def]
    from jaxbench.evaluate import EvalConfig, Evaluator

    ev = Evaluator(config=EvalConfig(timing=False, timeout_s=300))
    try:
        return ev.evaluate(task, source)
    finally:
        ev.close()


def test_taps_are_read_as_windows_of_the_phase_split_rows_and_adjacent_phases_share_a_product() -> None:
    # stride 2, width 3, padding (0, 1): taps 0 and 1 are row t's two phases, tap 2 is row t + 1's first.
    assert _tap_groups(3, 2, 1, 0, 128) == (0, 1, ((0, 0, 256, 0), (1, 0, 128, 256)))
    # padding before the input reaches back a row: the window starts one row before the output's.
    assert _tap_groups(5, 3, 1, 2, 64) == (-1, 0, ((0, 64, 128, 0), (1, 0, 192, 128)))
    # unit stride, dilation 2, causal: every tap its own row, one phase.
    assert _tap_groups(3, 1, 2, 4, 96) == (-4, 0, ((0, 0, 96, 0), (2, 0, 96, 96), (4, 0, 96, 192)))


@pytest.mark.parametrize("source", [STEM, STEM_WRITTEN_OUT], ids=["gelu", "written_out"])
def test_a_strided_stem_with_its_bias_and_gelu_fused_is_proposed_correct_and_lowers(tmp_path: Path, source: str) -> None:
    task = _task(tmp_path, "stem", source, dtype="bfloat16", tol="6.0e-2")
    analysis = analyze_task(task, "tpu-v6e")
    assert "template:tpu_conv" in [s.name for s in propose_strategies(task, analysis, "tpu-v6e")]
    p = plan(task, ("cpu", "full"))
    assert not isinstance(p, str) and p.rows is not None and p.tileable
    assert (p.rows.stride, p.rows.taps, p.rows.low, p.rows.high) == (2, 3, 0, 1)
    space = TPU_CONV.space(task, analysis, "tpu-v6e")
    source = TPU_CONV.render(task, space.defaults, ("cpu", "full"))
    assert "conv_general_dilated" not in source and "jax.lax.erfc" not in source
    assert "phased = x.reshape((n, -1, STRIDE * c))" in source and "static['stride']" in source
    assert "o_ref[...] = epilogue(" in source  # the bias and GELU on the tile
    report = _evaluate(task, source)
    assert report.passed and report.label == "pallas-kernel", report.reason
    result = validate_tpu(source, task, "v6e")
    assert result.ok, result.reason


def test_another_layout_stride_and_padding_with_a_tail_left_to_xla_is_correct_and_lowers(tmp_path: Path) -> None:
    task = _task(tmp_path, "thirds", THIRDS, cpu_length=500, full_length=12001)
    p = plan(task, ("cpu", "full"))
    assert not isinstance(p, str) and p.rows is not None and not p.tileable  # the norm couples the channels
    assert (p.rows.stride, p.rows.taps, p.rows.low, p.rows.high, p.rows.rhs_spec) == (3, 5, 2, 1, (0, 1, 2))
    space = TPU_CONV.space(task, analyze_task(task, "tpu-v6e"), "tpu-v6e")
    source = TPU_CONV.render(task, space.defaults, ("cpu", "full"))
    assert "jnp.transpose(w, (2, 1, 0))" in source and "return epilogue(h)" in source
    report = _evaluate(task, source)
    assert report.passed and report.label == "pallas-kernel", report.reason
    result = validate_tpu(source, task, "v6e")
    assert result.ok, result.reason


@pytest.mark.slow
def test_a_dilated_kernel_over_channels_that_are_not_whole_lanes_is_correct_and_lowers(tmp_path: Path) -> None:
    task = _task(tmp_path, "dilated", DILATED, channels=96)
    space = TPU_CONV.space(task, analyze_task(task, "tpu-v6e"), "tpu-v6e")
    source = TPU_CONV.render(task, space.defaults, ("cpu", "full"))
    report = _evaluate(task, source)
    assert report.passed and report.label == "pallas-kernel", report.reason
    result = validate_tpu(source, task, "v6e")
    assert result.ok, result.reason


GROUPED = STEM.replace("(3, channels, channels)", "(3, channels // 2, channels)").replace(
    'padding="SAME",', 'padding="SAME", feature_group_count=2,')
CHANNELS_FIRST = STEM.replace("y = jax.lax.conv_general_dilated(x, w,", "y = jax.lax.conv_general_dilated(jnp.swapaxes(x, 1, 2), w,").replace(
    '("NWC", "WIO", "NWC"))', '("NCW", "WIO", "NWC"))')


def _interpreted_kernel(source: str):  # type: ignore[no-untyped-def]
    """The rendered candidate's ``kernel`` with its pallas_call run in interpret mode on this CPU."""
    import types

    from jax.experimental import pallas as pl

    namespace: dict = {}
    exec(compile(source, "<candidate>", "exec"), namespace)
    pallas = types.SimpleNamespace(**{name: getattr(pl, name) for name in dir(pl) if not name.startswith("_")})
    pallas.pallas_call = lambda *args, **kwargs: pl.pallas_call(*args, interpret=True, **kwargs)
    namespace["pl"] = pallas
    return namespace["kernel"]


def test_same_padding_is_chosen_by_the_length_the_kernel_is_called_with(tmp_path: Path) -> None:
    """"SAME" with stride 2 pads (0, 1) an even length and (1, 1) an odd one: a kernel rendered at two even
    lengths still matches the reference, shape and values, at odd lengths it was never traced at."""
    import jax
    import numpy as np

    task = _task(tmp_path, "same", STEM.replace("jnp.bfloat16", "jnp.float32"))
    p = plan(task, ("cpu", "full"))
    assert not isinstance(p, str) and p.rows is not None
    assert p.rows.by_residue == ((0, 1), (1, 1))
    source = TPU_CONV.render(task, {**TPU_CONV.space(task, analyze_task(task, "tpu-v6e"), "tpu-v6e").defaults,
                                    "block_rows": 256}, ("cpu", "full"))
    assert "PADDING = ((0, 1), (1, 1))" in source and "PAD_LOW" not in source
    kernel = _interpreted_kernel(source)
    for length in (1001, 999, 1000):
        (x, w, b), statics = task.module.get_inputs(jax.random.key(length), batch=2, length=length, channels=128)
        got, want = np.asarray(kernel(x, w, b, **statics)), np.asarray(task.reference(x, w, b, **statics))
        assert got.shape == want.shape == (2, (length + 1) // 2, 128)
        np.testing.assert_allclose(got, want, atol=3e-2, rtol=3e-2)


# Padding the reference derives from the length by a rule that does not repeat with the stride.
PADDED_TO_SEVENS = STEM.replace('padding="SAME",', "padding=[(0, 1 + (-x.shape[1]) % 7)],")


def test_padding_that_changes_with_the_length_other_than_by_the_stride_is_refused(tmp_path: Path) -> None:
    task = _task(tmp_path, "sevens", PADDED_TO_SEVENS, dtype="bfloat16", tol="6.0e-2")
    found = plan(task, ("cpu", "full"))
    assert found == "a 1-D convolution whose padding changes with the length other than by its residue"


@pytest.mark.parametrize("source,reason", [(GROUPED, "a grouped 1-D convolution"),
                                           (CHANNELS_FIRST, "a 1-D convolution (the template serves")])
def test_near_misses_are_refused_with_their_reason(tmp_path: Path, source: str, reason: str) -> None:
    task = _task(tmp_path, "near", source, dtype="bfloat16", tol="6.0e-2")
    found = plan(task, ("cpu", "full"))
    assert isinstance(found, str) and found.startswith(reason), found


def test_a_strided_convolution_over_channels_that_are_not_whole_lanes_is_refused(tmp_path: Path) -> None:
    task = _task(tmp_path, "narrow", STEM, dtype="bfloat16", tol="6.0e-2", channels=96)
    assert TPU_CONV.applies(task, analyze_task(task, "tpu-v6e")) == (
        "a strided 1-D convolution over 96 channels (the stride's phases need whole 128-lane tiles)")
