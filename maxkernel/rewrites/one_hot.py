"""Indexing along a short axis written as one-hot selects instead of a gather or a scatter.

A router picks ``k`` of a few dozen experts per token and then reads the picked scores back
(``take_along_axis``) and writes them into a dense row (``zeros.at[rows, idx].set(w)``, or ``.add``). XLA
runs the gather and the scatter on a TPU as indexed loops, one element at a time (XLA:TPU prices this
task's scatter at ten times everything else the program does). When the indexed axis is short, comparing
it with each index and selecting is a few vector passes over data already in hand:

- a gather of ``k`` elements per row along the last axis: for each ``j``, the row's elements where the
  axis position equals index ``j``, summed (one term is not zero, so the sum is that element exactly);
- a scatter of ``k`` elements per row into the last axis: for each ``j`` in order, the row where the
  position equals index ``j`` takes update ``j`` (``set``: the last write wins, as in a sequential
  loop) or adds it (``add``: every duplicate adds).

Which dimensions are the rows is read from the operation's dimension numbers: batching dimensions, or a
full index whose leading components are each an iota along their own axis (what ``.at[arange(n)[:, None],
idx]`` builds), found by evaluating those components, which depend on no input. Out-of-bounds indices keep
the operation's mode: dropped (or filled) as a one-hot never matches them, clamped under ``clip``.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from maxkernel.analysis.program import Const, Node, Program, Var
from maxkernel.rewrites.base import Rewrite
from maxkernel.rewrites.build import splice_traced
from maxkernel.rewrites.numeric import evaluate_nodes

MAX_AXIS = 4096  # the longest indexed axis a one-hot pass is written for
MAX_INDICES = 32  # the most indices per row: each costs one pass over the operand


def _mode(node: Node) -> str:
    return str(getattr(node.params.get("mode"), "name", node.params.get("mode"))).lower()


def _last_axis_gather(node: Node) -> bool:
    """``out[*b, j] = operand[*b, idx[*b, j, 0]]``: batched over every axis but the last, one element each."""
    operand, indices = node.ins
    dn = node.params["dimension_numbers"]
    r = len(operand.shape)
    batch = tuple(range(r - 1))
    return (r >= 1 and tuple(dn.offset_dims) == () and tuple(dn.collapsed_slice_dims) == (r - 1,)
            and tuple(dn.start_index_map) == (r - 1,) and tuple(dn.operand_batching_dims) == batch
            and tuple(dn.start_indices_batching_dims) == batch
            and tuple(node.params["slice_sizes"]) == (1,) * r
            and indices.shape == operand.shape[:-1] + (indices.shape[-2], 1)
            and node.out.shape == operand.shape[:-1] + (indices.shape[-2],))


def _constant_value(program: Program, value: Any) -> np.ndarray | None:
    """The value of ``value`` when it depends on no input of the program (evaluated), else None."""
    if isinstance(value, Const):
        return np.asarray(value.value)
    producers = program.producers()
    needed: list[Node] = []
    stack, seen = [value], set()
    while stack:
        v = stack.pop()
        if not isinstance(v, Var) or id(v) in seen:
            continue
        seen.add(id(v))
        node = producers.get(v)
        if node is None:  # a program input
            return None
        needed.append(node)
        stack.extend(node.ins)
    wanted = {id(n) for n in needed}
    order = [n for n in program.nodes if id(n) in wanted]
    try:
        return evaluate_nodes(order, {})[value]
    except Exception:  # noqa: BLE001 - too large to fold, or a primitive that cannot run here: not a row iota
        return None


def _row_index_scatter(program: Program, node: Node) -> Any | None:
    """For a scatter of single elements into the last axis, rows by batching dimensions or by full indices
    whose leading components are iotas along their own axes: the column indices ``[*b, k, 1]``, else None."""
    operand, indices, updates = node.ins
    dn = node.params["dimension_numbers"]
    r = len(operand.shape)
    batch = tuple(range(r - 1))
    if tuple(dn.update_window_dims) != () or updates.shape != operand.shape[:-1] + (updates.shape[-1],):
        return None
    k = updates.shape[-1]
    if (tuple(dn.operand_batching_dims) == batch and tuple(dn.scatter_indices_batching_dims) == batch
            and tuple(dn.inserted_window_dims) == (r - 1,) and tuple(dn.scatter_dims_to_operand_dims) == (r - 1,)
            and indices.shape == operand.shape[:-1] + (k, 1)):
        return indices
    if (tuple(dn.operand_batching_dims) != () or tuple(dn.inserted_window_dims) != tuple(range(r))
            or tuple(dn.scatter_dims_to_operand_dims) != tuple(range(r))
            or indices.shape != operand.shape[:-1] + (k, r)):
        return None
    maker = program.producers().get(indices) if isinstance(indices, Var) else None
    if maker is None or maker.prim != "concatenate" or maker.params["dimension"] != r or \
            [op.shape[-1] for op in maker.ins] != [1] * r:
        return None
    for axis, part in enumerate(maker.ins[:-1]):
        value = _constant_value(program, part)
        if value is None:
            return None
        want = np.broadcast_to(np.arange(operand.shape[axis]).reshape(
            [-1 if d == axis else 1 for d in range(r - 1)] + [1, 1]), part.shape)
        if value.shape != part.shape or not np.array_equal(value, want):
            return None
    return maker.ins[-1]


def _take(operand: Any, idx: Any, *, mode: str, fill: Any) -> Any:
    n = operand.shape[-1]
    position = lax.broadcasted_iota(jnp.int32, operand.shape, operand.ndim - 1)
    columns = []
    for j in range(idx.shape[-2]):
        at = idx[..., j, :].astype(jnp.int32)
        if mode == "clip":
            at = jnp.clip(at, 0, n - 1)
        picked = jnp.sum(jnp.where(position == at, operand, jnp.zeros((), operand.dtype)), axis=-1,
                         keepdims=True, dtype=operand.dtype)
        if mode == "fill_or_drop":
            picked = jnp.where((at >= 0) & (at < n), picked, jnp.asarray(fill, operand.dtype))
        columns.append(picked)
    return jnp.concatenate(columns, axis=-1)


def _put(operand: Any, idx: Any, updates: Any, *, mode: str, add: bool) -> Any:
    n = operand.shape[-1]
    position = lax.broadcasted_iota(jnp.int32, operand.shape, operand.ndim - 1)
    out = operand
    for j in range(updates.shape[-1]):
        at = idx[..., j, :].astype(jnp.int32)
        if mode == "clip":
            at = jnp.clip(at, 0, n - 1)
        update = updates[..., j:j + 1].astype(operand.dtype)
        out = out + jnp.where(position == at, update, jnp.zeros((), operand.dtype)) if add else \
            jnp.where(position == at, update, out)
    return out


def one_hot_indexing(program: Program) -> int:
    count = 0
    for node in list(program.nodes):
        if node.prim not in ("gather", "scatter", "scatter-add", "scatter_add") or node not in program.nodes:
            continue
        operand = node.ins[0]
        kind = np.dtype(operand.dtype).kind
        if not operand.shape or operand.shape[-1] > MAX_AXIS or kind not in "fiu" and str(operand.dtype) != "bfloat16":
            continue
        mode = _mode(node)
        if mode not in ("fill_or_drop", "clip", "promise_in_bounds"):
            continue
        if node.prim == "gather":
            if not _last_axis_gather(node) or node.ins[1].shape[-2] > MAX_INDICES:
                continue
            fill = node.params.get("fill_value")
            fill = (np.nan if kind == "f" or str(operand.dtype) == "bfloat16" else 0) if fill is None else fill
            splice_traced(program, node, lambda o, i: _take(o, i, mode=mode, fill=fill), [operand, node.ins[1]])
            count += 1
            continue
        if node.prim == "scatter" and node.params.get("update_jaxpr") is not None:
            continue  # a scatter that combines by a function of its own: not a plain set
        columns = _row_index_scatter(program, node)
        if columns is None or node.ins[2].shape[-1] > MAX_INDICES:
            continue
        add = node.prim != "scatter"
        splice_traced(program, node, lambda o, i, u: _put(o, i, u, mode=mode, add=add),
                      [operand, columns, node.ins[2]])
        count += 1
    return count


ONE_HOT_INDEXING = Rewrite("one_hot_indexing", "a gather or scatter of a few elements per row along a short axis "
                           "as one-hot selects", one_hot_indexing)
