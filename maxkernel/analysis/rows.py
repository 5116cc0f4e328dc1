"""Row structure: can the reference be computed one block of output rows at a time?

Rows are the output's leading axes. An input is row-blocked when it shares them; others (weights,
biases) are read whole by every block. The reference is row-independent when perturbing one row of the
row-blocked inputs changes only that output row (BatchNorm over the batch is not; RMSNorm is). This is
checked on real inputs, because it is what decides whether a row-block kernel is worth rendering.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

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


def block_probe(task: "Task", size: str, row_dims: int, blocked: "list[bool] | tuple[bool, ...]") -> str | None:
    """Why the reference cannot run on one block of rows the way a row-block kernel runs it, or None.

    A row-block kernel hands the reference a block of rows of each row-blocked input (the row axes
    flattened, then shaped (1, ..., 1, rows)) and every other input whole. An input read whole that the
    reference indexes by a row axis (a per-batch mask beside [batch, rows, cols] logits, a per-channel
    filter beside [batch, channels, time] data) then meets the block's single batch or channel: the
    reference fails, or broadcasts to the wrong shape. Probed on shapes only."""
    shapes = input_shapes(task, size)
    fn = functools.partial(task.reference, **static_args(task, size))
    out = jax.tree_util.tree_leaves(jax.eval_shape(fn, *shapes))[0]
    lead = tuple(out.shape[:row_dims])
    rows = int(min(8, np.prod(lead)))
    block = (1,) * (row_dims - 1) + (rows,)
    inputs = [jax.ShapeDtypeStruct(block + tuple(s.shape[row_dims:]), s.dtype) if b else s
              for s, b in zip(shapes, blocked)]
    want = block + tuple(out.shape[row_dims:])
    try:
        got = jax.tree_util.tree_leaves(jax.eval_shape(fn, *inputs))[0]
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0][:160]
        return (f"the reference does not run on a block of rows {list(block)} with its other inputs whole: an input "
                f"read whole is indexed by the row axes {list(lead)} ({type(exc).__name__}: {first})")
    if tuple(got.shape) != want:
        return (f"the reference on a block of rows gives {list(got.shape)}, not {list(want)}: an input read whole is "
                f"indexed by the row axes {list(lead)} (a per-batch mask or per-channel weights)")
    return None


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
