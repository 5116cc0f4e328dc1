"""Priced = checked for matmul precision: TPU candidates are checked with the MXU numerics they are priced at.

A default-precision float32 matmul is priced as one bfloat16 pass; its check rounds the operands to bfloat16
(f32 accumulation), so a candidate that needs float32 accuracy there is incorrect on a TPU target.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.core import jaxpr_as_fun
from jax.experimental import pallas as pl
from target_kernels import write_task

from jaxbench.task import load_task
from jaxbench.tpu_numerics import mxu_class, with_tpu_matmuls
from maxkernel.evaluation import evaluate_candidate
from maxkernel.targets import ops

# float32 in and out, checked tighter than one bfloat16 pass can reach (error ~0.05 at k=256, output ~16).
F32_MATMUL_TASK = {
    "task.yaml": """\
id: tgt_f32_matmul
name: Float32Matmul
category: matmul
description: out = x @ y in float32, exact float32 accumulation.
dtype: float32
tolerance: {atol: 1.0e-3, rtol: 1.0e-3}
sizes:
  cpu: {m: 256, k: 256, n: 256}
  full: {m: 512, k: 256, n: 512}
""",
    "reference.py": """\
import jax
import jax.numpy as jnp


def get_inputs(key, *, m, k, n):
    kx, ky = jax.random.split(key)
    return (jax.random.normal(kx, (m, k), jnp.float32), jax.random.normal(ky, (k, n), jnp.float32)), {}


def reference(x, y):
    return jnp.dot(x, y, precision=jax.lax.Precision.HIGHEST)
""",
}

PLAIN_DEFAULT = """\
import jax.numpy as jnp


def kernel(x, y):
    return jnp.dot(x, y)
"""

PLAIN_HIGHEST = PLAIN_DEFAULT.replace("import jax.numpy as jnp\n", "import jax\nimport jax.numpy as jnp\n").replace(
    "jnp.dot(x, y)", "jnp.dot(x, y, precision=jax.lax.Precision.HIGHEST)")

PALLAS_TEMPLATE = """\
import jax
import jax.numpy as jnp
from jax._src.core import jaxpr_as_fun
from jax.experimental import pallas as pl


def _body(x_ref, y_ref, o_ref):
    o_ref[...] = jnp.dot(x_ref[...], y_ref[...]{precision}, preferred_element_type=jnp.float32)


def kernel(x, y):
    m, k = x.shape
    n = y.shape[1]
    return pl.pallas_call(
        _body,
        grid=(m // 128, n // 128),
        in_specs=[pl.BlockSpec((128, k), lambda i, j: (i, 0)), pl.BlockSpec((k, 128), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((128, 128), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
    )(x, y)
"""


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_task(tmp_path_factory.mktemp("tasks") / "tgt_f32_matmul", F32_MATMUL_TASK)


def _operands(m: int = 64, k: int = 256, n: int = 128) -> tuple[jax.Array, jax.Array]:
    kx, ky = jax.random.split(jax.random.key(0))
    return jax.random.normal(kx, (m, k), jnp.float32), jax.random.normal(ky, (k, n), jnp.float32)


def _rounded(x: jax.Array) -> np.ndarray:
    return np.asarray(x.astype(jnp.bfloat16).astype(jnp.float32), np.float64)


def _run_rewritten(fn, *args):  # type: ignore[no-untyped-def]
    rewritten = with_tpu_matmuls(jax.make_jaxpr(fn)(*args))
    return rewritten, np.asarray(jax.jit(jaxpr_as_fun(rewritten.closed))(*args)[0], np.float64)


def test_price_and_check_share_one_classification() -> None:
    assert ops._mxu_class is mxu_class
    assert mxu_class(np.float32, np.float32, None) == "bf16"
    assert mxu_class(np.float32, jnp.bfloat16, jax.lax.Precision.DEFAULT) == "bf16"
    assert mxu_class(np.float32, np.float32, (jax.lax.Precision.HIGH,) * 2) == "f32_high"
    assert mxu_class(np.float32, np.float32, jax.lax.Precision.HIGHEST) == "f32"


def test_default_precision_rounds_operands_to_bf16_and_accumulates_in_f32() -> None:
    x, y = _operands()
    rewritten, out = _run_rewritten(lambda a, b: jnp.dot(a, b), x, y)
    assert rewritten.changed == {"bf16": 1}
    np.testing.assert_allclose(out, _rounded(x) @ _rounded(y), rtol=1e-5, atol=1e-4)
    exact = np.asarray(x, np.float64) @ np.asarray(y, np.float64)
    assert np.max(np.abs(out - exact)) > 1e-2  # the rounding is really there


def test_mixed_bf16_f32_rounds_the_f32_operand() -> None:
    x, y = _operands()
    rewritten, out = _run_rewritten(lambda a, b: jnp.dot(a.astype(jnp.bfloat16), b, preferred_element_type=jnp.float32),
                                    x, y)
    assert rewritten.changed == {"bf16": 1}
    np.testing.assert_allclose(out, _rounded(x) @ _rounded(y), rtol=1e-5, atol=1e-4)


def test_high_is_three_passes_and_highest_is_exact() -> None:
    x, y = _operands()
    exact = np.asarray(x, np.float64) @ np.asarray(y, np.float64)
    high, out_high = _run_rewritten(lambda a, b: jnp.dot(a, b, precision=jax.lax.Precision.HIGH), x, y)
    assert high.changed == {"f32_high": 1}
    one_pass = _rounded(x) @ _rounded(y)
    err_high = np.max(np.abs(out_high - exact))
    assert 0 < err_high < np.max(np.abs(one_pass - exact)) / 50
    highest, out_highest = _run_rewritten(lambda a, b: jnp.dot(a, b, precision=jax.lax.Precision.HIGHEST), x, y)
    assert highest.count == 0
    np.testing.assert_allclose(out_highest, exact, rtol=1e-5, atol=1e-4)


def test_rewrite_reaches_every_sub_program() -> None:
    x, y = _operands(k=128, n=128)

    @jax.custom_jvp
    def custom(a: jax.Array) -> jax.Array:
        return a @ y

    custom.defjvp(lambda primals, tangents: (custom(primals[0]), tangents[0] @ y))

    def body(carry: jax.Array, _: None) -> tuple[jax.Array, None]:
        return jnp.tanh(carry @ y), None

    def fn(a: jax.Array) -> jax.Array:
        scanned, _ = jax.lax.scan(body, a, None, length=2)
        looped = jax.lax.fori_loop(0, 2, lambda i, c: jnp.tanh(c @ y), a)
        branched = jax.lax.cond(a[0, 0] > 0, lambda c: c @ y, lambda c: c @ y.T, a)
        nested = jax.jit(lambda c: c @ y)(a)
        return scanned + looped + branched + nested + custom(a)

    rewritten = with_tpu_matmuls(jax.make_jaxpr(fn)(x))
    assert rewritten.changed == {"bf16": 6}  # scan, while, both branches, jit, custom_jvp
    got = jax.jit(jaxpr_as_fun(rewritten.closed))(x)[0]
    assert got.shape == x.shape and bool(jnp.all(jnp.isfinite(got)))


def test_rewrite_reaches_pallas_kernel_bodies() -> None:
    x, y = _operands(m=128, k=128, n=128)

    def body(x_ref, y_ref, o_ref):  # type: ignore[no-untyped-def]
        o_ref[...] = jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

    fn = pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct((128, 128), jnp.float32), interpret=True)
    rewritten, out = _run_rewritten(fn, x, y)
    assert rewritten.changed == {"bf16": 1}
    np.testing.assert_allclose(out, _rounded(x) @ _rounded(y), rtol=1e-5, atol=1e-4)


@pytest.mark.slow
def test_default_precision_f32_matmul_is_incorrect_on_tpu_and_ok_on_cpu(task: Path) -> None:
    loaded = load_task(task)
    tpu = evaluate_candidate(loaded, PLAIN_DEFAULT, target="tpu-v6e")
    assert tpu.status == "incorrect", tpu.reason
    assert tpu.reason.startswith("incorrect under TPU matmul precision")
    cpu = evaluate_candidate(loaded, PLAIN_DEFAULT, target="cpu")
    assert cpu.status == "ok", cpu.reason


def test_a_candidate_wrong_at_any_precision_is_not_blamed_on_the_tpu(task: Path) -> None:
    report = evaluate_candidate(load_task(task), PLAIN_DEFAULT.replace("jnp.dot(x, y)", "jnp.dot(x, y) * 1.01"),
                                target="tpu-v6e")
    assert report.status == "incorrect", report.reason
    assert "TPU matmul precision" not in report.reason


def test_highest_precision_f32_matmul_is_ok_on_tpu(task: Path) -> None:
    report = evaluate_candidate(load_task(task), PLAIN_HIGHEST, target="tpu-v6e")
    assert report.status == "ok", report.reason
    assert report.basis == "modelled"


@pytest.mark.slow
def test_pallas_kernel_default_precision_dot_is_rounded(task: Path) -> None:
    loaded = load_task(task)
    default = evaluate_candidate(loaded, PALLAS_TEMPLATE.format(precision=""), target="tpu-v6e")
    assert default.status == "incorrect", default.reason
    assert "TPU matmul precision" in default.reason
    highest = evaluate_candidate(loaded, PALLAS_TEMPLATE.format(precision=", precision=jax.lax.Precision.HIGHEST"),
                                 target="tpu-v6e")
    assert highest.status == "ok", highest.reason
