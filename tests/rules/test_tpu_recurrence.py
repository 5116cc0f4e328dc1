"""The recurrence template: an elementwise scan over one axis, written however its reference writes it,
correct in interpret mode with several grid steps along the sequence and lowering for tpu-v6e; what is not
such a scan is refused with its reason."""

from __future__ import annotations

from pathlib import Path

import pytest
from maxkernel.analysis import analyze_task
from maxkernel.targets import validate_tpu
from maxkernel.templates.tpu_recurrence import TPU_RECURRENCE, plan
from support import task_folder, task_yaml

GATED = '''\
import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, length, width):
    k1, k2 = jax.random.split(key)
    gate = jax.random.normal(k1, (batch, length, width), jnp.float32) + 2.0
    x = jax.random.normal(k2, (batch, length, width), jnp.float32)
    return (gate, x), {}


def reference(gate, x):
    a = jax.nn.sigmoid(gate)
    b = (1.0 - a) * x

    def step(h, ab):
        at, bt = ab
        h = at * h + bt
        return h, h

    _, hs = jax.lax.scan(step, jnp.zeros_like(x[:, 0]), (jnp.swapaxes(a, 0, 1), jnp.swapaxes(b, 0, 1)))
    return jnp.swapaxes(hs, 0, 1) * 2.0
'''

# The same gated recurrence with no scan at all: an associative scan over the (a, b) pairs, whose program is a
# tree of strided slices, products and sums along the sequence.
ASSOCIATIVE = '''\
import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, length, width):
    k1, k2 = jax.random.split(key)
    return (jax.random.normal(k2, (batch, length, width), jnp.float32),
            jax.random.normal(k1, (batch, length, width), jnp.float32) + 2.0), {}


def reference(x, gate):
    a = jax.nn.sigmoid(gate)

    def combine(left, right):
        return left[0] * right[0], right[0] * left[1] + right[1]

    _, h = jax.lax.associative_scan(combine, (a, (1.0 - a) * x), axis=1)
    return h * 2.0
'''

# The sequence axis first, two carries (a running max and a decayed sum), two outputs per step.
TWO_CARRIES = '''\
import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, length, width):
    return (jax.random.normal(key, (length, batch, width), jnp.float32),), {}


def reference(v):
    def step(carry, vt):
        peak, total = carry
        peak = jnp.maximum(peak, vt)
        total = 0.9 * total + vt
        return (peak, total), (peak - vt, total)

    init = (jnp.full(v.shape[1:], -1e30, v.dtype), jnp.zeros(v.shape[1:], v.dtype))
    _, (gap, total) = jax.lax.scan(step, init, v)
    return gap + total
'''


def _task(tmp_path: Path, name: str, source: str):  # type: ignore[no-untyped-def]
    return task_folder(tmp_path, name, task_yaml(name, "recurrence", 0.001, {"batch": 2, "length": 256, "width": 256},
                                                   {"batch": 8, "length": 4096, "width": 2048}, "batch"), source)


@pytest.mark.parametrize("name, source, axis", [("gated", GATED, 1), ("two_carries", TWO_CARRIES, 0),
                                                ("associative", ASSOCIATIVE, 1)])
def test_an_elementwise_scan_runs_in_one_kernel(tmp_path, declared_size_evaluator, name: str, source: str,
                                                axis: int) -> None:  # type: ignore[no-untyped-def]
    task = _task(tmp_path, name, source)
    p = plan(task, ("cpu", "full"))
    assert not isinstance(p, str), p
    assert p.axis == axis
    # cpu size: 256 steps in blocks of 64 (4 along the sequence), 2 lane groups of 128 a block
    source_text = TPU_RECURRENCE.render(task, {"block_t": 64, "block_g": 2}, ("cpu", "full"))
    assert "jax.lax.fori_loop" in source_text and '"arbitrary"' in source_text
    report = declared_size_evaluator.evaluate(task, source_text)
    assert report.passed and report.label == "pallas-kernel", report.reason
    space = TPU_RECURRENCE.space(task, analyze_task(task, "tpu-v6e"), "tpu-v6e")
    result = validate_tpu(TPU_RECURRENCE.render(task, space.defaults, ("cpu", "full")), task, "v6e")
    assert result.ok, result.reason


def test_what_is_not_an_elementwise_scan_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    reverse = GATED.replace("(jnp.swapaxes(a, 0, 1), jnp.swapaxes(b, 0, 1)))",
                            "(jnp.swapaxes(a, 0, 1), jnp.swapaxes(b, 0, 1)), reverse=True)")
    assert "reverse" in str(plan(_task(tmp_path, "reverse", reverse), ("cpu",)))
    mixing = GATED.replace("h = at * h + bt", "h = at * h + bt.sum(axis=-1, keepdims=True)")
    assert "not elementwise" in str(plan(_task(tmp_path, "mixing", mixing), ("cpu",)))
    narrow = GATED.replace("(batch, length, width)", "(batch, length, width + 3)")
    assert "lanes" in str(plan(_task(tmp_path, "narrow", narrow), ("cpu",)))


def test_an_associative_scan_that_is_not_the_linear_recurrence_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # a running maximum (associative, not linear), and the linear recurrence run backwards along the sequence
    running_max = ASSOCIATIVE.replace("_, h = jax.lax.associative_scan(combine, (a, (1.0 - a) * x), axis=1)",
                                      "h = jax.lax.associative_scan(jnp.maximum, (1.0 - a) * x, axis=1)")
    backwards = ASSOCIATIVE.replace("axis=1)", "axis=1, reverse=True)")
    for name, source in (("running_max", running_max), ("backwards", backwards)):
        assert "nor a linear recurrence without one" in str(plan(_task(tmp_path, name, source), ("cpu",))), name
