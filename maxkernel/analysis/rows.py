"""Row structure: can the reference be computed one block of output rows at a time?

Rows are the output's leading axes. An input is row-blocked when it shares them; others (weights,
biases) are read whole by every block. The reference is row-independent when perturbing one row of the
row-blocked inputs changes only that output row (BatchNorm over the batch is not; RMSNorm is). This is
checked on real inputs, because it is what decides whether a row-block kernel is worth rendering.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import jax
import numpy as np
from maxkernel.analysis.models import RowLayout
from maxkernel.analysis.program import input_shapes, static_args

if TYPE_CHECKING:
    from jaxbench.task import Task


def row_layout(task: "Task", size: str = "cpu") -> RowLayout | None:
    shapes = input_shapes(task, size)
    static = static_args(task, size)
    fn = functools.partial(task.reference, **static)
    out = jax.eval_shape(fn, *shapes)
    leaves = jax.tree_util.tree_leaves(out)
    if len(leaves) != 1 or len(leaves[0].shape) < 1:
        return None
    out_shape = tuple(leaves[0].shape)
    row_dims = max(1, len(out_shape) - 1)
    lead = out_shape[:row_dims]
    blocked = [tuple(s.shape[:row_dims]) == lead and s.dtype.kind == "f" for s in shapes]
    if not any(blocked) or int(np.prod(lead)) < 2:
        return None
    return RowLayout(rows=int(np.prod(lead)), row_dims=row_dims, blocked=blocked,
                     independent=_independent(task, fn, blocked, row_dims))


def partly_row_indexed(shapes: "list[Any]", lead: tuple[int, ...]) -> list[int]:
    """Inputs that share a leading part of the row axes but not all of them (a per-batch mask beside
    [batch, rows, ...] data): a row-block kernel flattens the row axes into one and reads every other input
    whole, so its body would meet the mask's batch axis beside a block's single one. Such a reference is
    not served by row blocks as written."""
    found = []
    for i, s in enumerate(shapes):
        shape = tuple(s.shape)
        if shape[: len(lead)] == lead:
            continue
        if any(len(shape) > j and shape[:j] == lead[:j] for j in range(1, len(lead))):
            found.append(i)
    return found


def _independent(task: "Task", fn: functools.partial, blocked: list[bool], row_dims: int) -> bool:
    args, _ = task.get_inputs(jax.random.key(0), "cpu")
    jitted = jax.jit(fn)
    base = np.asarray(jitted(*args))
    changed = [np.asarray(a).copy() for a in args]
    for i, is_blocked in enumerate(blocked):
        if is_blocked:
            flat = changed[i].reshape((-1,) + changed[i].shape[row_dims:])
            flat[0] = flat[0] * 1.5 + 0.25
    after = np.asarray(jitted(*changed))
    diff = (base != after).reshape(-1, *base.shape[row_dims:]) if base.ndim > row_dims else (base != after).reshape(-1, 1)
    rows_changed = diff.reshape(diff.shape[0], -1).any(axis=1)
    return bool(rows_changed[0]) and not bool(rows_changed[1:].any())
