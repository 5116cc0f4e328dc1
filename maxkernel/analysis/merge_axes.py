"""A computation over rows kept in two leading axes (``[batch, seq, d]`` activations), seen over one.

Real layers take ``[batch, seq, d]`` activations; the work is the same as over ``[batch * seq, d]`` rows
when both axes are parallel (every output carries them first, nothing reduces, contracts, slices or counts
along them). A sketch that reads a matmul of a matrix of rows does not find the three-dimensional one.
:func:`merge_leading_axes` follows the pair from the arguments that carry it through the traced program and
rebuilds every node that carries it over one merged axis: its parameters renumbered and its result shape
taken from the primitive itself. The pair is found by data flow (:mod:`maxkernel.sketches.axes`), never by
names or argument positions; what reads either axis on its own is refused with the reason.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from jax import lax

from maxkernel.analysis.program import Const, Node, Operand, Program, Var
from maxkernel.analysis.unit_axis import Refused, collapse_layout, LayoutRebuild, _drop
from maxkernel.sketches.axes import ALONG_ONE_AXIS, ELEMENTWISE, REDUCING, analyse_axes, parallel_labels


def _merge(shape: Any, c: int) -> tuple[int, ...]:
    shape = tuple(int(x) for x in shape)
    return shape[:c] + (shape[c] * shape[c + 1],) + shape[c + 2:]


def _after(dims: Any, c: int) -> tuple[int, ...]:
    """Axis numbers of an operand whose axes ``c`` and ``c + 1`` become one (neither is among them)."""
    return tuple(int(x) - (int(x) > c + 1) for x in dims)


class _Merger(LayoutRebuild):
    """Rebuilds a program with the pair of axes each value carries at ``(c, c + 1)`` merged into ``c``."""

    def __init__(self, program: Program, carriers: dict[int, int]) -> None:
        super().__init__(program)
        self.carriers = carriers

    def without(self, op: Operand, d: int) -> Operand:
        """``op`` with its axes ``d, d + 1`` merged: the pair it carries there, or (a value that does not
        carry it, which an elementwise op lines up with it) its own two axes there, merged."""
        new, carried = self.get(op)
        if carried == d:
            return new
        if carried is not None:
            raise Refused(f"an operand carries the merged axes at {carried}, not {d}")
        shape = _merge(op.shape, d)
        if isinstance(op, Const):
            return Const(np.asarray(op.value).reshape(shape), shape, op.dtype, op.weak, op.static)
        made = next((n for n in reversed(self.new.nodes) if new in n.outs), None)
        if made is not None and made.prim == "broadcast_in_dim" and len(made.ins) == 1:
            dims = tuple(int(x) for x in made.params["broadcast_dimensions"])
            if d not in dims and d + 1 not in dims:  # broadcast straight to the merged shape
                params = {**made.params, "shape": shape, "broadcast_dimensions": _after(dims, d)}
                return self.bind(made.primitive, list(made.ins), params, [None])[0]
        return self.bind(lax.reshape_p, [new], {"new_sizes": shape, "dimensions": None, "sharding": None}, [None])[0]

    WHAT = "the merged axes"

    def visit(self, node: Node) -> None:
        carried = [(op, self.get(op)[1]) for op in node.ins if isinstance(op, Var) and self.get(op)[1] is not None]
        if not carried:
            self._copy(node)
            return
        self._dispatch(node, carried)

    def _rule(self, prim: str) -> Any:
        return {"broadcast_in_dim": self._broadcast_in_dim, "reshape": self._reshape, "transpose": self._transpose,
                "dot_general": self._dot_general}.get(prim)

    def _elementwise(self, node: Node, params: dict[str, Any], carried: list[tuple[Var, int]]) -> None:
        d = self._one_axis(carried)
        rank = len(node.out.shape)
        if any(0 < len(op.shape) < rank for op in node.ins):
            raise Refused(f"{node.prim} of operands of different ranks")
        ins = [self.without(op, d) if len(op.shape) == rank else self.get(op)[0] for op in node.ins]
        self._emit(node, ins, params, [d])

    def _broadcast_in_dim(self, node: Node, params: dict[str, Any], carried: list[tuple[Var, int]]) -> None:
        (_, c), = carried
        dims = tuple(int(x) for x in params["broadcast_dimensions"])
        t = dims[c]
        if dims[c + 1] != t + 1:
            raise Refused("a broadcast that separates the merged axes")
        params["broadcast_dimensions"] = _after(_drop(dims, c + 1), t)
        params["shape"] = _merge(params["shape"], t)
        self._emit(node, [self.get(op)[0] for op in node.ins], params, [t])

    def _reshape(self, node: Node, params: dict[str, Any], carried: list[tuple[Var, int]]) -> None:
        (src, c), = carried
        out = tuple(node.out.shape)
        before = math.prod(src.shape[:c])
        at = next((q for q in range(len(out) - 1) if out[q] == src.shape[c] and out[q + 1] == src.shape[c + 1]
                   and math.prod(out[:q]) == before), None)
        if params.get("dimensions") is not None or at is None:
            raise Refused("a reshape that splits or joins the merged axes")
        params["new_sizes"] = _merge(out, at)
        self._emit(node, [self.get(src)[0]], params, [at])

    def _transpose(self, node: Node, params: dict[str, Any], carried: list[tuple[Var, int]]) -> None:
        (src, c), = carried
        perm = tuple(int(x) for x in params["permutation"])
        at = perm.index(c)
        if at + 1 >= len(perm) or perm[at + 1] != c + 1:
            raise Refused("a transpose that separates the merged axes")
        params["permutation"] = _after(_drop(perm, at + 1), c)
        self._emit(node, [self.get(src)[0]], params, [at])

    def _reduce(self, node: Node, params: dict[str, Any], carried: list[tuple[Var, int]]) -> None:
        (src, c), = carried
        axes = tuple(int(x) for x in params["axes"])
        if c in axes or c + 1 in axes:
            raise Refused(f"{node.prim} over a merged axis")
        params["axes"] = _after(axes, c)
        self._emit(node, [self.get(src)[0]], params, [c - sum(a < c for a in axes)])

    def _along(self, node: Node, params: dict[str, Any], carried: list[tuple[Var, int]]) -> None:
        d = self._one_axis(carried)
        key = ALONG_ONE_AXIS[node.prim]
        if int(params[key]) in (d, d + 1):
            raise Refused(f"{node.prim} along a merged axis")
        params[key] = _after((int(params[key]),), d)[0]
        self._emit(node, [self.without(op, d) for op in node.ins], params, [d] * len(node.outs))

    def _dot_general(self, node: Node, params: dict[str, Any], carried: list[tuple[Var, int]]) -> None:
        lhs, rhs = node.ins
        lc, rc, lb, rb, cl, cr, lfree, rfree = self._dot_parts(node, params)
        if cl is not None and cr is None and cl in lfree and cl + 1 in lfree and lfree.index(cl + 1) == lfree.index(cl) + 1:
            at = len(lb) + lfree.index(cl)
            params["dimension_numbers"] = ((_after(lc, cl), rc), (_after(lb, cl), rb))
            self._emit(node, [self.get(lhs)[0], self.get(rhs)[0]], params, [at])
            return
        if cr is not None and cl is None and cr in rfree and cr + 1 in rfree and rfree.index(cr + 1) == rfree.index(cr) + 1:
            at = len(lb) + len(lfree) + rfree.index(cr)
            params["dimension_numbers"] = ((lc, _after(rc, cr)), (lb, _after(rb, cr)))
            self._emit(node, [self.get(lhs)[0], self.get(rhs)[0]], params, [at])
            return
        raise Refused("a matmul that contracts, batches or splits the merged axes")

    def run(self) -> Program:
        for i, v in enumerate(self.old.inputs):
            c = self.carriers.get(i)
            new = Var(v.name, v.shape if c is None else _merge(v.shape, c), v.dtype, v.origin)
            self.new.inputs.append(new)
            self.env[v] = (new, c)
        for node in self.old.nodes:
            self.visit(node)
        for out in self.old.outputs:
            if not isinstance(out, Var) or self.get(out)[1] != 0:
                raise Refused("a result that does not lead with the merged axes")
            self.new.outputs.append(self.get(out)[0])
        return collapse_layout(self.new)


def leading_pair(program: Program) -> dict[int, int] | str:
    """Which arguments carry the outputs' two leading axes, and where (argument index -> first of the two
    axes), when both are parallel and every carrier holds them side by side; else why not."""
    outputs = [o for o in program.outputs if isinstance(o, Var)]
    if not outputs or len(outputs) != len(program.outputs) or any(len(o.shape) < 3 for o in outputs):
        return "the results are not batches of rows of rows (rank 3 or more)"
    axes = analyse_axes(program)
    parallel = set(parallel_labels(program, axes))
    first = outputs[0]
    pair = (axes.label(first, 0), axes.label(first, 1))
    if not set(pair) <= parallel:
        return "the two leading axes of the result are not both parallel"
    for out in outputs:
        if (axes.label(out, 0), axes.label(out, 1)) != pair:
            return "the results do not all lead with the same two axes"
    carriers: dict[int, int] = {}
    for i, v in enumerate(program.inputs):
        where = [a for a in range(len(v.shape)) if axes.label(v, a) in pair]
        if not where:
            continue
        if len(where) != 2 or where[1] != where[0] + 1 or axes.label(v, where[0]) != pair[0]:
            return f"argument {v.name} holds the leading axes apart or in another order"
        carriers[i] = where[0]
    if not carriers:
        return "no argument carries the leading axes"
    return carriers


def merge_leading_axes(program: Program, carriers: dict[int, int] | None = None) -> Program | str:
    """``program`` over its outputs' two leading axes merged into one (``carriers``: which arguments carry
    them where, found by :func:`leading_pair` when not given); or why it cannot be."""
    if carriers is None:
        found = leading_pair(program)
        if isinstance(found, str):
            return found
        carriers = found
    try:
        return _Merger(program, carriers).run()
    except Refused as exc:
        return str(exc)
