"""The planner's views: a computation under a leading axis of one (a layer mapped over a batch of one), or
over rows kept in two leading axes (``[batch, seq, d]``), rebuilt without the axis or with the rows merged is
the same computation; the sketches that serve it serve the task through the view; what mixes those axes
with others is refused with its reason."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest
from maxkernel.analysis import analyze_task
from maxkernel.analysis.program import run_program, trace_program
from maxkernel.analysis.unit_axis import drop_unit_axis
from maxkernel.rules.strategy import propose_strategies, render
from maxkernel.rules.views import WITHOUT_UNIT_AXIS, unit_axis_reason
from maxkernel.targets import validate_tpu
from support import task_folder, task_yaml

# A projection with a bias and a clamp, written for one example (weight first, einsum) and mapped over a
# batch of one: every matmul is a batched one, every argument and the result lead with the axis of one.
PROJECTION = '''\
import jax
import jax.numpy as jnp


def get_inputs(key, *, tokens, width):
    k1, k2, k3 = jax.random.split(key, 3)
    proj = jax.random.normal(k1, (1, width, 256), jnp.float32) / width ** 0.5
    h = jax.random.normal(k2, (1, tokens, width), jnp.float32)
    bias = jax.random.normal(k3, (1, 256), jnp.float32)
    return (proj, h, bias), {}


def _one(proj, h, bias):
    y = jnp.einsum("td,de->te", h, proj, precision=jax.lax.Precision.HIGHEST) + bias
    return jnp.clip(y, -1.0, 1.0) * 0.5


def reference(proj, h, bias):
    return jax.vmap(_one)(proj, h, bias)
'''

# A convolution mapped the same way: JAX folds the axis into the convolution's batch with a transposing
# reshape and unfolds it after.
CONV = '''\
import jax
import jax.numpy as jnp


def get_inputs(key, *, images, width):
    k1, k2 = jax.random.split(key)
    x = jax.random.normal(k1, (1, images, 8, width, width), jnp.float32)
    w = jax.random.normal(k2, (1, 16, 8, 3, 3), jnp.float32) / 8.0
    return (x, w), {}


def _one(x, w):
    y = jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", precision=jax.lax.Precision.HIGHEST)
    return jax.nn.relu(y)


def reference(x, w):
    return jax.vmap(_one)(x, w)
'''


# A decayed causal score matrix (as retention builds one), mapped over a batch of one: the positions'
# difference ``i[:, None] - i[None, :]`` broadcasts two inserted axes of one to full extents, and
# ``jnp.broadcast_to`` repeats one.
DECAY = '''\
import jax
import jax.numpy as jnp


def get_inputs(key, *, tokens, width):
    kq, kk = jax.random.split(key)
    q = jax.random.normal(kq, (1, tokens, width), jnp.float32)
    k = jax.random.normal(kk, (1, tokens, width), jnp.float32)
    return (q, k), {}


def _one(q, k):
    i = jnp.arange(q.shape[0])
    gap = i[:, None] - i[None, :]
    decay = jnp.where(gap >= 0, 0.97 ** gap.astype(jnp.float32), 0.0)
    rows = jnp.broadcast_to(i[:, None].astype(jnp.float32), decay.shape)  # an inserted axis repeated
    return (q @ k.T) * decay * (1.0 + 0.01 * rows)


def reference(q, k):
    return jax.vmap(_one)(q, k)
'''


def _task(tmp_path: Path, name: str, source: str, dims: tuple[str, str] = ("tokens", "width")):  # type: ignore[no-untyped-def]
    cpu, full = ({dims[0]: 64, dims[1]: 128}, {dims[0]: 1024, dims[1]: 512}) if dims[0] == "tokens" else \
        ({dims[0]: 2, dims[1]: 16}, {dims[0]: 8, dims[1]: 64})
    return task_folder(tmp_path, name, task_yaml(name, "matmul", 0.001, cpu, full, dims[0]), source)


def _without_axis(task, size: str = "cpu"):  # type: ignore[no-untyped-def]
    args, static = task.get_inputs(jax.random.key(1), size)
    program = drop_unit_axis(trace_program(task, size))
    assert not isinstance(program, str), program
    expected = np.asarray(task.reference(*args, **static))[0]
    got = np.asarray(run_program(program, [a[0] for a in args]))
    return program, expected, got


def test_a_mapped_projection_is_a_plain_matmul_without_the_axis(tmp_path) -> None:  # type: ignore[no-untyped-def]
    program, expected, got = _without_axis(_task(tmp_path, "projection", PROJECTION))
    (dot,) = [n for n in program.nodes if n.prim == "dot_general"]
    (_, (lhs_batch, rhs_batch)) = dot.params["dimension_numbers"]
    assert lhs_batch == () and rhs_batch == ()  # the batched matmul became a plain one
    assert [v.shape for v in program.inputs] == [(128, 256), (64, 128), (256,)]
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


def test_positions_broadcast_against_each_other_are_not_the_axis(tmp_path) -> None:  # type: ignore[no-untyped-def]
    program, expected, got = _without_axis(_task(tmp_path, "decay", DECAY))
    assert [v.shape for v in program.outputs] == [(64, 64)]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_a_mapped_convolution_loses_its_folding_reshapes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    program, expected, got = _without_axis(_task(tmp_path, "conv", CONV, ("images", "width")))
    assert "reshape" not in program.primitives() and "transpose" not in program.primitives()
    assert "conv_general_dilated" in program.primitives()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


# A relative-position bias looked up in a per-head table, mapped over a batch of one: the table carries the
# axis, the bucket indices (positions, with the index vector's inserted axis of one) do not.
TABLE_BIAS = '''\
import jax
import jax.numpy as jnp


def get_inputs(key, *, tokens, width):
    ks, kt = jax.random.split(key)
    scores = jax.random.normal(ks, (1, 4, tokens, tokens), jnp.float32)
    table = jax.random.normal(kt, (1, 4, width), jnp.float32)
    return (scores, table), {}


def _one(scores, table):
    i = jnp.arange(scores.shape[-1])
    bucket = jnp.clip(i[:, None] - i[None, :], 0, table.shape[-1] - 1)
    return jax.nn.softmax(scores + table[:, bucket], axis=-1)


def reference(scores, table):
    return jax.vmap(_one)(scores, table)
'''

# Each example's own indices into its own table: both carry the axis, a batching dimension of the gather.
OWN_INDICES = '''\
import jax
import jax.numpy as jnp


def get_inputs(key, *, tokens, width):
    kt, ki = jax.random.split(key)
    table = jax.random.normal(kt, (1, width, 8), jnp.float32)
    ids = jax.random.randint(ki, (1, tokens), 0, width)
    return (table, ids), {}


def reference(table, ids):
    return jax.vmap(lambda t, i: jnp.tanh(t[i]) * 2.0)(table, ids)
'''


@pytest.mark.parametrize("name", ["table_bias", "own_indices"])
def test_a_mapped_lookup_is_a_plain_gather_without_the_axis(tmp_path, name: str) -> None:  # type: ignore[no-untyped-def]
    program, expected, got = _without_axis(_task(tmp_path, name, {"table_bias": TABLE_BIAS, "own_indices": OWN_INDICES}[name]))
    (gather,) = [n for n in program.nodes if n.prim == "gather"]
    numbers = gather.params["dimension_numbers"]
    assert numbers.operand_batching_dims == () and numbers.start_indices_batching_dims == ()
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("old, new, why", [
    # the axis of one joined to another along itself: the result's leading axis is two, not one
    ("return jax.vmap(_one)(proj, h, bias)", "return jnp.concatenate([jax.vmap(_one)(proj, h, bias)] * 2, axis=0)[:1] * 2.0",
     "concatenation along the axis of one"),
    # the result does not lead with the axis of one (it is summed away)
    ("return jax.vmap(_one)(proj, h, bias)", "return jax.vmap(_one)(proj, h, bias).sum(axis=0)",
     "a result without the leading axis of one"),
    # the axis of one is an argument's only, not every argument's
    ("bias = jax.random.normal(k3, (1, 256), jnp.float32)", "bias = jax.random.normal(k3, (256,), jnp.float32)",
     "not every argument leads with an axis of one"),
])
def test_what_does_not_carry_the_axis_through_is_refused(tmp_path, old: str, new: str,
                                                           why: str) -> None:  # type: ignore[no-untyped-def]
    source = PROJECTION.replace(old, new)
    if "(256,)" in new:
        source = source.replace("return jax.vmap(_one)(proj, h, bias)", "return jax.vmap(_one, in_axes=(0, 0, None))(proj, h, bias)")
    task = _task(tmp_path, "near_miss", source)
    assert why in str(unit_axis_reason(task))
    planned = propose_strategies(task, analyze_task(task, "tpu-v6e"), "tpu-v6e")
    assert not any(s.params.get("view") for s in planned)


def test_the_planner_offers_the_gemm_sketch_through_the_view(tmp_path, declared_size_evaluator) -> None:  # type: ignore[no-untyped-def]
    task = _task(tmp_path, "projection", PROJECTION)
    planned = {s.name: s for s in propose_strategies(task, analyze_task(task, "tpu-v6e"), "tpu-v6e")}
    gemm = planned["template:tpu_gemm"]
    assert gemm.params["view"] == WITHOUT_UNIT_AXIS and "view" not in gemm.space
    source = render(task, gemm)
    assert "def kernel(proj, h, bias, **static):" in source and "proj.reshape(proj.shape[1:])" in source and "pl.pallas_call" in source
    report = declared_size_evaluator.evaluate(task, source)
    assert report.passed and report.label == "pallas-kernel", report.reason
    result = validate_tpu(source, task, "v6e")
    assert result.ok, result.reason


# Activations kept as [batch, seq, d], as real layers take them: a projection with a GELU over the rows.
ROWS = '''\
import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, seq, width):
    k1, k2, k3 = jax.random.split(key, 3)
    h = jax.random.normal(k1, (batch, seq, width), jnp.float32)
    w = jax.random.normal(k2, (width, 256), jnp.float32) / width ** 0.5
    shift = jax.random.normal(k3, (256,), jnp.float32)
    return (w, h, shift), {}


def reference(w, h, shift):
    y = jnp.einsum("bsd,de->bse", h, w, precision=jax.lax.Precision.HIGHEST) + shift
    return jax.nn.gelu(y)
'''


def _rows_task(tmp_path: Path, name: str, source: str):  # type: ignore[no-untyped-def]
    return task_folder(tmp_path, name, task_yaml(name, "matmul", 0.001, {"batch": 2, "seq": 64, "width": 128},
                                                   {"batch": 8, "seq": 512, "width": 512}, "batch"), source)


def test_rows_in_two_leading_axes_are_a_matrix_of_rows_merged(tmp_path, declared_size_evaluator) -> None:  # type: ignore[no-untyped-def]
    from maxkernel.analysis.merge_axes import leading_pair, merge_leading_axes
    from maxkernel.rules.views import ROWS_MERGED

    task = _rows_task(tmp_path, "rows", ROWS)
    program = trace_program(task, "cpu")
    assert leading_pair(program) == {1: 0}  # the activations, wherever they stand among the arguments
    merged = merge_leading_axes(program)
    assert not isinstance(merged, str), merged
    assert [v.shape for v in merged.inputs] == [(128, 256), (128, 128), (256,)]
    args, static = task.get_inputs(jax.random.key(2), "cpu")
    got = np.asarray(run_program(merged, [args[0], args[1].reshape(128, 128), args[2]]))
    np.testing.assert_allclose(got.reshape(2, 64, 256), np.asarray(task.reference(*args)), rtol=1e-6, atol=1e-6)
    planned = {s.name: s for s in propose_strategies(task, analyze_task(task, "tpu-v6e"), "tpu-v6e")}
    gemm = planned["template:tpu_gemm"]
    assert gemm.params["view"] == ROWS_MERGED
    source = render(task, gemm)
    assert "h.reshape(-1, *h.shape[2:])" in source
    report = declared_size_evaluator.evaluate(task, source)
    assert report.passed and report.label == "pallas-kernel", report.reason


def test_a_constant_with_a_default_in_the_signature_is_not_an_argument_of_the_view(tmp_path, declared_size_evaluator) -> None:  # type: ignore[no-untyped-def]
    """``def reference(w, h, shift, slope=0.01)``: get_inputs passes three arrays; the slope keeps its default.
    The view's reference and the candidate's ``kernel`` take the three arrays (the view once passed the
    slope on as a fourth array and failed)."""
    from maxkernel.analysis.program import arg_names
    from maxkernel.rules.views import ROWS_MERGED, task_view

    source = ROWS.replace("def reference(w, h, shift):", "def reference(w, h, shift, slope=0.01):").replace(
        "return jax.nn.gelu(y)", "return jnp.maximum(y, slope * y)")
    task = _rows_task(tmp_path, "defaulted", source)
    assert arg_names(task) == ["w", "h", "shift"]
    view = task_view(task, ROWS_MERGED)
    assert view is not None
    args, static = view.get_inputs(jax.random.key(2), "cpu")
    assert np.asarray(view.reference(*args, **static)).shape == (128, 256)
    gemm = {s.name: s for s in propose_strategies(task, analyze_task(task, "tpu-v6e"), "tpu-v6e")}["template:tpu_gemm"]
    rendered = render(task, gemm)
    assert "def kernel(w, h, shift, **static):" in rendered
    report = declared_size_evaluator.evaluate(task, rendered)
    assert report.passed and report.label == "pallas-kernel", report.reason


@pytest.mark.parametrize("old, new, why", [
    # a mean over the sequence: the second axis is reduced, not a row
    ("return jax.nn.gelu(y)", "return jax.nn.gelu(y - y.mean(axis=1, keepdims=True))", "not both parallel"),
    # the batch and the sequence swapped on the way out
    ("return jax.nn.gelu(y)", "return jnp.swapaxes(jax.nn.gelu(y), 0, 1)", "in another order"),
])
def test_rows_that_are_not_independent_are_not_merged(tmp_path, old: str, new: str, why: str) -> None:  # type: ignore[no-untyped-def]
    from maxkernel.rules.views import ROWS_MERGED, view_reason

    task = _rows_task(tmp_path, "near_miss", ROWS.replace(old, new))
    reason = view_reason(task, ROWS_MERGED)
    assert isinstance(reason, str) and why in reason, reason


# A caller that keeps the batch merged into one flat vector; the layer splits it first and flattens last.
FLAT = '''\
import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, features, hidden):
    k1, k2 = jax.random.split(key)
    x = jax.random.normal(k1, (batch * features,), jnp.float32)
    w = jax.random.normal(k2, (features, hidden), jnp.float32) / features ** 0.5
    return (x, w), {"rows": batch}


def reference(x, w, *, rows):
    y = jnp.dot(x.reshape(rows, -1), w, precision=jax.lax.Precision.HIGHEST)
    return jnp.maximum(y, 0.1 * y).reshape(-1)
'''


def _flat_task(tmp_path: Path, name: str, source: str):  # type: ignore[no-untyped-def]
    return task_folder(tmp_path, name, task_yaml(name, "matmul", 0.001, {"batch": 64, "features": 256, "hidden": 256},
                                                   {"batch": 512, "features": 1024, "hidden": 1024}, "batch"), source)


def test_a_batch_merged_by_the_caller_is_split_at_the_edges(tmp_path, declared_size_evaluator) -> None:  # type: ignore[no-untyped-def]
    from maxkernel.rules.views import RESHAPED

    task = _flat_task(tmp_path, "flat", FLAT)
    planned = {s.name: s for s in propose_strategies(task, analyze_task(task, "tpu-v6e"), "tpu-v6e")}
    gemm = planned["template:tpu_gemm"]
    assert gemm.params["view"] == RESHAPED
    source = render(task, gemm)
    # the feature count is read from the weight's rows (what x is split by), not its columns (the hidden
    # size), which equal it at both of the task's sizes but not at the moved sizes the edges are traced at
    into = source[source.index("def _into_view"):source.index("def _out_of_view")]
    assert "w.shape[0]" in into and "w.shape[1]" not in into, into
    report = declared_size_evaluator.evaluate(task, source)
    assert report.passed and report.label == "pallas-kernel", report.reason


def test_an_argument_read_whole_too_is_not_reshaped_at_the_edge(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from maxkernel.rules.views import RESHAPED, view_reason

    both = FLAT.replace("return jnp.maximum(y, 0.1 * y).reshape(-1)", "return jnp.maximum(y, 0.1 * y).reshape(-1) + x")
    assert "no argument is read only through a reshape" in str(view_reason(_flat_task(tmp_path, "both", both), RESHAPED))


def test_a_batch_count_of_one_at_the_task_size_is_still_read_from_its_static(tmp_path, declared_size_evaluator) -> None:  # type: ignore[no-untyped-def]
    """One example at the cpu size: the split ``x.reshape(rows, -1)`` reads ``rows``, which is 1 there, 512 at
    the full size and 9 at the moved size the edges are traced at."""
    task = task_folder(tmp_path, "one", task_yaml("one", "matmul", 0.001, {"batch": 1, "features": 256, "hidden": 256},
                                                   {"batch": 512, "features": 1024, "hidden": 1024}, "batch"), FLAT)
    gemm = {s.name: s for s in propose_strategies(task, analyze_task(task, "tpu-v6e"), "tpu-v6e")}["template:tpu_gemm"]
    source = render(task, gemm)
    into = source[source.index("def _into_view"):source.index("def _out_of_view")]
    assert "def _into_view(x, w, *, rows)" in into and "x.reshape((rows, w_dim0))" in into, into
    report = declared_size_evaluator.evaluate(task, source)
    assert report.passed and report.label == "pallas-kernel", report.reason
