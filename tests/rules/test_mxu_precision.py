"""Precision follows the tolerance: a TPU kernel's float32 products use the fewest bf16 MXU passes that meet
the task's tolerance against the exact result, decided by the computation and the tolerance (never by the
precision the reference wrote, never per task), and a one-pass kernel found wrong only at its MXU precision
is retried at three passes."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.core import jaxpr_as_fun

from jaxbench.report import EvalReport
from jaxbench.task import Task, load_task
from jaxbench.tpu_numerics import with_tpu_matmuls
from maxkernel.analysis.precision import admitted_passes, precision_need
from maxkernel.rules.fixes import fix_known_error
from maxkernel.templates.tpu_gemm import (W_KN_DIMENSIONS, TpuGemmTemplate, _mxu_source, chosen_passes, plan,
                                          split_source)
from maxkernel.rewrites.emit import EmitError


def _gemm_task(folder: Path, precision: str, tol: float) -> Task:
    """relu(x @ w) in float32 at ``precision`` ("None" or "jax.lax.Precision.HIGHEST"), checked at ``tol``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "task.yaml").write_text(f"""\
id: {folder.name}
name: {folder.name}
category: matmul
description: out = relu(x @ w), float32.
dtype: float32
tolerance: {{atol: {tol}, rtol: {tol}}}
sizes:
  cpu: {{m: 256, k: 512, n: 512}}
  full: {{m: 512, k: 512, n: 512}}
""")
    (folder / "reference.py").write_text(f"""\
import jax
import jax.numpy as jnp


def get_inputs(key, *, m, k, n):
    kx, kw = jax.random.split(key)
    return (jax.random.normal(kx, (m, k), jnp.float32), jax.random.normal(kw, (k, n), jnp.float32) / k ** 0.5), {{}}


def reference(x, w):
    return jax.nn.relu(jnp.dot(x, w, precision={precision}))
""")
    return load_task(folder)


def test_forcing_a_class_computes_every_float32_product_at_that_many_passes() -> None:
    kx, kw = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, (64, 512), jnp.float32)
    w = jax.random.normal(kw, (512, 64), jnp.float32)
    closed = jax.make_jaxpr(lambda a, b: jnp.dot(a, b, precision=jax.lax.Precision.HIGHEST))(x, w)
    exact = np.asarray(jnp.dot(x, w, precision=jax.lax.Precision.HIGHEST), np.float64)

    def run(force: str | None) -> np.ndarray:
        rewritten = with_tpu_matmuls(closed, force)
        return np.asarray(jaxpr_as_fun(rewritten.closed)(x, w)[0], np.float64)

    assert np.array_equal(run(None), exact.astype(np.float32))  # HIGHEST: computed exactly, as before
    one, three = np.abs(run("bf16") - exact).max(), np.abs(run("f32_high") - exact).max()
    assert one > 50 * three > 0  # one pass drops ~8 mantissa bits, three keep ~16
    assert np.array_equal(run("f32"), exact.astype(np.float32))
    with pytest.raises(ValueError, match="unknown MXU class"):
        with_tpu_matmuls(closed, "fp8")


def test_the_need_follows_the_tolerance_not_the_precision_the_reference_wrote(tmp_path: Path) -> None:
    # HIGHEST written, but a tolerance one bf16 pass meets with room: one pass.
    loose = precision_need(_gemm_task(tmp_path / "loose_highest", "jax.lax.Precision.HIGHEST", 5e-2))
    assert loose.own_passes == 6 and not loose.own_misses
    assert loose.ratios[1] <= 0.5 and admitted_passes(loose) == [1]
    # Default precision written, but a tolerance one pass misses: three passes (six as their retry), and the
    # reference itself misses its own tolerance on a TPU.
    tight = precision_need(_gemm_task(tmp_path / "tight_default", "None", 1e-3))
    assert tight.own_passes == 1 and tight.own_misses and tight.ratios[1] > 1.0 >= tight.ratios[3]
    assert admitted_passes(tight) == [3, 6]
    text = tight.describe()
    assert "misses its own tolerance" in text and "three bf16 passes (HIGH) pass" in text and "atol 0.001" in text
    # Beyond what three passes reach: six.
    tighter = precision_need(_gemm_task(tmp_path / "tighter", "None", 1e-7))
    assert admitted_passes(tighter) == [6]


def test_the_gemm_template_offers_and_renders_only_the_admitted_passes(tmp_path: Path) -> None:
    template = TpuGemmTemplate()
    loose = _gemm_task(tmp_path / "loose_highest", "jax.lax.Precision.HIGHEST", 5e-2)
    space = template.space(loose, None, "tpu-v6e")  # type: ignore[arg-type]
    assert space.space["passes"] == [1] and space.defaults["passes"] == 1
    tight = _gemm_task(tmp_path / "tight_default", "None", 1e-3)
    space = template.space(tight, None, "tpu-v6e")  # type: ignore[arg-type]
    assert space.space["passes"] == [3, 6] and space.defaults["passes"] == 3
    p = plan(tight, ("cpu", "full"))
    assert not isinstance(p, str)
    with pytest.raises(EmitError):
        chosen_passes(p, {"passes": 1}, tight)  # one pass misses this task's tolerance
    source = template.render(tight, {**space.defaults}, ("cpu", "full"))
    assert "3 MXU passes per product" in source and "_split(x)" in source


def test_a_one_pass_kernel_wrong_only_at_its_precision_is_retried_at_three_passes(tmp_path: Path) -> None:
    template = TpuGemmTemplate()
    loose = _gemm_task(tmp_path / "loose_highest", "jax.lax.Precision.HIGHEST", 5e-2)
    source = template.render(loose, template.space(loose, None, "tpu-v6e").defaults, ("cpu", "full"))  # type: ignore[arg-type]
    assert _mxu_source(W_KN_DIMENSIONS, 1) in source
    split = split_source(source)
    assert split is not None and _mxu_source(W_KN_DIMENSIONS, 3) in split and split.count("def _split(") == 1
    assert "3 MXU passes per product" in split and _mxu_source(W_KN_DIMENSIONS, 1) not in split
    compile(split, "split.py", "exec")

    report = EvalReport(task=loose.id, target="tpu-v6e", size="check", status="incorrect",
                        reason="incorrect under TPU matmul precision (a TPU rounds ...; exact float32 passes): "
                               "max abs err 0.02")
    assert fix_known_error(source, report) == split
    other = report.model_copy(update={"reason": "inputs_seed_0: max abs err 3.1"})
    assert fix_known_error(source, other) is None  # wrong for another reason: not a precision retry
