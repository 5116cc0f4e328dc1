"""Linear pooling after a matmul folded into the weights.

Average (or sum) pooling over windows of a matmul's output features is linear, so it commutes with the
matmul: ``pool(x @ W + b) == x @ pool(W) + pool(b)`` with ``pool`` applied along the same feature axis.
The matmul then produces ``windows`` features instead of ``windows * k``: k times less work. Recognised
as the reference writes it: an optional bias add, an optional slice dropping features that do not fill
a window, a reshape splitting the feature axis into (windows, k) and a sum over k (a mean is that sum
scaled, and the scale stays where it is).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from maxkernel.analysis.program import Node, Program, Var
from maxkernel.rewrites.base import Rewrite, single_use
from maxkernel.rewrites.build import splice_traced


def _split_axis(x: Var, y: Var) -> tuple[int, int, int] | None:
    """(axis, windows, k) when reshape ``y`` -> ``x`` splits one axis of y into two, else None."""
    ys, xs = tuple(y.shape), tuple(x.shape)
    if len(xs) != len(ys) + 1:
        return None
    for j in range(len(ys)):
        if ys[:j] == xs[:j] and ys[j + 1:] == xs[j + 2:] and xs[j] * xs[j + 1] == ys[j]:
            return j, xs[j], xs[j + 1]
    return None


def _match(program: Program, red: Node) -> tuple[Node, list[Var], int, int, Node | None] | None:
    producers = program.producers()
    (axis,) = red.params["axes"] if len(red.params["axes"]) == 1 else (None,)
    x = red.ins[0]
    reshape = producers.get(x) if isinstance(x, Var) else None
    if axis is None or reshape is None or reshape.prim != "reshape" or not single_use(program, x):
        return None
    y = reshape.ins[0]
    split = _split_axis(x, y) if isinstance(y, Var) else None  # type: ignore[arg-type]
    if split is None or axis != split[0] + 1:
        return None
    j, windows, k = split
    cur = y
    node = producers.get(cur)
    if node is not None and node.prim == "slice" and single_use(program, cur):
        starts, limits = node.params["start_indices"], node.params["limit_indices"]
        strides = node.params.get("strides")
        src = node.ins[0]
        if (strides not in (None, (1,) * len(starts)) or any(starts) or not isinstance(src, Var)
                or any(limits[d] != src.shape[d] for d in range(len(starts)) if d != j)):
            return None
        cur = src
        node = producers.get(cur)
    bias_node: Node | None = None
    if node is not None and node.prim == "add" and single_use(program, cur):
        dots = [op for op in node.ins if isinstance(op, Var) and (p := producers.get(op)) is not None and p.prim == "dot_general"]
        others = [op for op in node.ins if op not in dots]
        if len(dots) != 1 or len(others) != 1 or not isinstance(others[0], Var):
            return None
        b = producers.get(others[0])
        if b is None or b.prim != "broadcast_in_dim" or len(b.ins[0].shape) != 1 or tuple(b.params["broadcast_dimensions"]) != (j,):  # type: ignore[union-attr]
            return None
        bias_node = b
        cur = dots[0]
        node = producers.get(cur)
    if node is None or node.prim != "dot_general" or not single_use(program, cur):
        return None
    lhs, rhs = node.ins
    (lc, rc), (lb, rb) = node.params["dimension_numbers"]
    rfree = [d for d in range(len(rhs.shape)) if d not in rc and d not in rb]
    if not isinstance(lhs, Var) or not isinstance(rhs, Var) or len(rfree) != 1 or j != len(cur.shape) - 1:
        return None
    operands = [lhs, rhs] + ([bias_node.ins[0]] if bias_node is not None else [])  # type: ignore[list-item]
    return node, operands, windows, k, bias_node


def _pooled(dot: Node, windows: int, k: int, has_bias: bool) -> Any:
    (lc, rc), (lb, rb) = dot.params["dimension_numbers"]
    free = next(d for d in range(len(dot.ins[1].shape)) if d not in rc and d not in rb)  # type: ignore[union-attr]
    params = {key: dot.params[key] for key in ("dimension_numbers", "precision", "preferred_element_type")}

    def pool(v: Any, axis: int) -> Any:
        v = jax.lax.slice_in_dim(v, 0, windows * k, axis=axis)
        v = v.reshape(v.shape[:axis] + (windows, k) + v.shape[axis + 1:])
        return jnp.sum(v, axis=axis + 1)

    def fn(lhs: Any, rhs: Any, bias: Any = None) -> Any:
        out = jax.lax.dot_general(lhs, pool(rhs, free), **params)
        return out + pool(bias, 0) if has_bias else out

    return fn


def fold_pooling(program: Program) -> int:
    count = 0
    for red in list(program.nodes):
        if red.prim != "reduce_sum":
            continue
        found = _match(program, red)
        if found is None:
            continue
        dot, operands, windows, k, bias = found
        splice_traced(program, red, _pooled(dot, windows, k, bias is not None), operands)
        program.dce()
        count += 1
    return count


POOL_INTO_WEIGHTS = Rewrite("pool_into_weights", "pooling over a matmul's output features folded into the weights",
                            fold_pooling)
