"""A computation whose every argument and result carries a leading axis of one, seen without that axis.

A layer written for one example and mapped with ``jax.vmap`` over a batch of one, or a batch dimension a
caller keeps at one, makes every matmul a batched one and every reduction one rank deeper: nothing about the
work changes, but a sketch that reads a plain matmul no longer finds it. :func:`drop_unit_axis` follows the
axis of one from the arguments through the traced program (each primitive maps it to one dimension of its
result, or removes it: a reduction over it, a squeeze, a reshape that drops it) and rebuilds every node that
carries it without it, its parameters renumbered and its result shape taken from the primitive itself. A
value that meets the axis with a dimension of one of its own (an ``iota`` broadcast beside it) is squeezed
there. A primitive that mixes the axis with others (a gather, a loop) leaves the computation as it is, with
the reason.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np
from jax import lax

from maxkernel.analysis.program import Const, Node, Operand, Program, Var
from maxkernel.sketches.axes import ALONG_ONE_AXIS, ELEMENTWISE, REDUCING


class Refused(Exception):
    """The axis of one cannot be dropped here (the message says which primitive and why)."""


def _drop(seq: Any, d: int) -> tuple[Any, ...]:
    return tuple(x for i, x in enumerate(seq) if i != d)


def _renumber(dims: Any, d: int | None) -> tuple[int, ...]:
    """Axis numbers of an operand that loses axis ``d`` (none of them is ``d``)."""
    return tuple(int(x) - (d is not None and int(x) > d) for x in dims)


class LayoutRebuild:
    def __init__(self, program: Program) -> None:
        self.old = program
        self.new = Program([], [], [], program.out_tree, program._counter, dict(program.dim_names), list(program.notes))
        self.env: dict[Var, tuple[Operand, int | None]] = {}
        # Values whose axis of one a reshape or broadcast put there (the unfolding after a convolution), and
        # what only they feed: where the arguments' axis meets them elsewhere, the arguments' place is kept,
        # and where an elementwise op broadcasts their axis of one to a longer extent, it was not the axis.
        self.inserted: set[Var] = set()

    # -- operands -----------------------------------------------------------------------------------
    def get(self, op: Operand) -> tuple[Operand, int | None]:
        return (op, None) if isinstance(op, Const) else self.env[op]

    def without(self, op: Operand, d: int) -> Operand:
        """``op`` (an old operand) with its axis ``d`` gone: the axis of one it carries there, or a
        dimension of one of its own, squeezed."""
        new, carried = self.get(op)
        if carried == d:
            return new
        if op.shape[d] != 1:
            raise Refused(f"an operand of shape {op.shape} meets the axis of one at its axis {d}")
        if carried is not None:  # an axis of one at another place: the same values, reshaped
            return self.bind(lax.reshape_p, [new], {"new_sizes": _drop(op.shape, d), "dimensions": None,
                                                     "sharding": None}, [None])[0]
        if isinstance(op, Const):
            value = np.squeeze(np.asarray(op.value, dtype=op.dtype), d)
            return Const(value, tuple(value.shape), op.dtype, op.weak, op.static)
        return self.bind(lax.squeeze_p, [new], {"dimensions": (d,)}, [None])[0]

    def bind(self, primitive: Any, ins: list[Operand], params: dict[str, Any], like: list[Var | None],
             source: tuple[str, int] | None = None) -> list[Var]:
        """A new node; its results' shapes come from the primitive (named as the old results ``like``)."""
        var_ins = [op for op in ins if isinstance(op, Var)]

        def run(*vals: Any) -> Any:
            it = iter(vals)
            args = [next(it) if isinstance(op, Var) else np.asarray(op.value, dtype=op.dtype) for op in ins]
            return primitive.bind(*args, **params)

        try:
            shaped = jax.eval_shape(run, *[jax.ShapeDtypeStruct(v.shape, v.dtype) for v in var_ins])
        except Exception as exc:  # noqa: BLE001 - the renumbered node is not one the primitive takes
            raise Refused(f"{primitive.name} without the axis of one: {type(exc).__name__}: {exc}") from exc
        shaped = list(shaped) if primitive.multiple_results else [shaped]
        outs = []
        for s, old in zip(shaped, like):
            var = self.new.fresh(s.shape, s.dtype)
            if old is not None:
                var = Var(old.name, tuple(int(x) for x in s.shape), np.dtype(s.dtype), old.origin)
            outs.append(var)
        self.new.nodes.append(Node(primitive, list(ins), outs, dict(params), source))
        return outs

    # -- nodes --------------------------------------------------------------------------------------
    def visit(self, node: Node) -> None:
        if node.prim in ELEMENTWISE and len(node.outs) == 1:
            for op in node.ins:  # an inserted axis of one that this op broadcasts to a longer extent
                if isinstance(op, Var) and op in self.inserted and node.out.shape[self.get(op)[1]] != 1:
                    self.restore(op)
        carried = [(op, self.get(op)[1]) for op in node.ins if isinstance(op, Var) and self.get(op)[1] is not None]
        if not carried and self._inserts_unit(node):
            return
        if not carried:
            self._copy(node)
            return
        self._dispatch(node, carried)

    # The layout this rebuilds programs without, as its refusals name it.
    WHAT = "the axis of one"

    def _copy(self, node: Node) -> None:
        """A node that reads nothing carrying the axis, as it is."""
        ins = [self.get(op)[0] for op in node.ins]
        self.new.nodes.append(Node(node.primitive, ins, list(node.outs), dict(node.params), node.source, node.notes))
        for out in node.outs:
            self.env[out] = (out, None)

    def _rule(self, prim: str) -> Any:
        return getattr(self, f"_{prim}", None)

    def _dispatch(self, node: Node, carried: list[tuple[Var, int]]) -> None:
        prim, params = node.prim, dict(node.params)
        rule = self._rule(prim)
        if prim in ELEMENTWISE and len(node.outs) == 1:
            rule = self._elementwise
        elif prim in REDUCING:
            rule = self._reduce
        elif prim in ALONG_ONE_AXIS:
            rule = self._along
        if rule is None:
            raise Refused(f"{prim} reads {self.WHAT}")
        rule(node, params, carried)

    def _inserts_unit(self, node: Node) -> bool:
        """A reshape or broadcast that only inserts an axis of one: its result is its operand with that axis,
        which is what carrying the axis there means."""
        if node.prim not in ("reshape", "broadcast_in_dim") or not isinstance(node.ins[0], Var) or len(node.ins) > 1:
            return False
        if node.prim == "reshape" and node.params.get("dimensions") is not None:
            return False
        src, out = node.ins[0], node.out
        for at in range(len(out.shape)):
            if out.shape[at] == 1 and _drop(out.shape, at) == tuple(src.shape):
                if node.prim == "broadcast_in_dim" and tuple(node.params["broadcast_dimensions"]) != _drop(range(len(out.shape)), at):
                    continue
                self.env[out] = (self.get(src)[0], at)
                self.inserted.add(out)
                return True
        return False

    def restore(self, op: Var) -> None:
        """``op`` with its inserted axis of one back in place, no longer carrying it."""
        new, _ = self.get(op)
        value = self.bind(lax.reshape_p, [new], {"new_sizes": tuple(op.shape), "dimensions": None, "sharding": None},
                          [None])[0]
        self.env[op] = (value, None)
        self.inserted.discard(op)

    def _emit(self, node: Node, ins: list[Operand], params: dict[str, Any], at: list[int | None]) -> None:
        outs = self.bind(node.primitive, ins, params, list(node.outs), node.source)
        carriers = [op for op in node.ins if isinstance(op, Var) and self.get(op)[1] is not None]
        for old, new, d in zip(node.outs, outs, at):
            self.env[old] = (new, d)
            if d is not None and carriers and all(op in self.inserted for op in carriers):
                self.inserted.add(old)

    def _alias(self, node: Node, value: Operand) -> None:
        self.env[node.out] = (value, None)

    def _one_axis(self, carried: list[tuple[Var, int]]) -> int:
        dims = {d for v, d in carried if v not in self.inserted} or {d for _, d in carried}
        if len(dims) != 1:
            raise Refused("operands carry the axis of one at different axes")
        return dims.pop()

    def _elementwise(self, node: Node, params: dict[str, Any], carried: list[tuple[Var, int]]) -> None:
        d = self._one_axis(carried)
        rank = len(node.out.shape)
        ins = [self.without(op, d) if len(op.shape) == rank else self.get(op)[0] for op in node.ins]
        if any(0 < len(op.shape) < rank for op in node.ins):
            raise Refused(f"{node.prim} of operands of different ranks")
        self._emit(node, ins, params, [d])

    def _broadcast_in_dim(self, node: Node, params: dict[str, Any], carried: list[tuple[Var, int]]) -> None:
        (src, c), = carried
        dims = tuple(int(x) for x in params["broadcast_dimensions"])
        t = dims[c]
        if int(params["shape"][t]) != 1:  # the axis of one repeated to a longer extent: it was not the axis
            if src not in self.inserted:
                raise Refused("a broadcast that repeats the axis of one")
            self.restore(src)
            self.visit(node)
            return
        params["broadcast_dimensions"] = _renumber(_drop(dims, c), t)
        params["shape"] = _drop(params["shape"], t)
        self._emit(node, [self.get(op)[0] for op in node.ins], params, [t])

    def _reshape(self, node: Node, params: dict[str, Any], carried: list[tuple[Var, int]]) -> None:
        (src, c), = carried
        perm = tuple(range(len(src.shape))) if params.get("dimensions") is None else tuple(int(x) for x in params["dimensions"])
        order = _renumber(tuple(p for p in perm if p != c), c)  # a reshape's ``dimensions`` transpose first
        params["dimensions"] = None if order == tuple(range(len(order))) else order
        out = tuple(node.out.shape)
        before = math.prod(src.shape[p] for p in perm[:perm.index(c)])
        at = next((p for p, s in enumerate(out) if s == 1 and math.prod(out[:p]) == before), None)
        params["new_sizes"] = out if at is None else _drop(out, at)
        new = self.get(src)[0]
        if params["dimensions"] is None and tuple(params["new_sizes"]) == tuple(new.shape):
            self.env[node.out] = (new, at)  # only the axis of one moved: nothing left to do
            if src in self.inserted and at is not None:
                self.inserted.add(node.out)
            return
        self._emit(node, [new], params, [at])

    def _squeeze(self, node: Node, params: dict[str, Any], carried: list[tuple[Var, int]]) -> None:
        (src, c), = carried
        dims = tuple(int(x) for x in params["dimensions"])
        rest = _renumber(tuple(x for x in dims if x != c), c)
        if not rest:
            self._alias(node, self.get(src)[0])
            return
        params["dimensions"] = rest
        self._emit(node, [self.get(src)[0]], params, [None if c in dims else c - sum(x < c for x in dims)])

    def _transpose(self, node: Node, params: dict[str, Any], carried: list[tuple[Var, int]]) -> None:
        (src, c), = carried
        perm = tuple(int(x) for x in params["permutation"])
        params["permutation"] = _renumber(tuple(p for p in perm if p != c), c)
        if params["permutation"] == tuple(range(len(perm) - 1)):  # only the axis of one moved
            self.env[node.out] = (self.get(src)[0], perm.index(c))
            if src in self.inserted:
                self.inserted.add(node.out)
            return
        self._emit(node, [self.get(src)[0]], params, [perm.index(c)])

    def _reduce(self, node: Node, params: dict[str, Any], carried: list[tuple[Var, int]]) -> None:
        (src, c), = carried
        axes = tuple(int(x) for x in params["axes"])
        if c in axes and node.prim in ("argmax", "argmin"):
            raise Refused(f"{node.prim} over the axis of one")
        params["axes"] = _renumber(tuple(a for a in axes if a != c), c)
        if not params["axes"]:  # a reduction over the axis of one alone keeps every value
            self._alias(node, self.get(src)[0])
            return
        self._emit(node, [self.get(src)[0]], params, [None if c in axes else c - sum(a < c for a in axes)])

    def _along(self, node: Node, params: dict[str, Any], carried: list[tuple[Var, int]]) -> None:
        d = self._one_axis(carried)
        key = ALONG_ONE_AXIS[node.prim]
        if int(params[key]) == d and len(node.outs) == 1 and node.prim != "sort":
            self._alias(node, self.get(node.ins[0])[0])  # a running sum (max ...) over one element
            return
        if int(params[key]) == d:
            raise Refused(f"{node.prim} along the axis of one")
        params[key] = int(params[key]) - (int(params[key]) > d)
        self._emit(node, [self.without(op, d) for op in node.ins], params, [d] * len(node.outs))

    def _dot_parts(self, node: Node, params: dict[str, Any]) -> tuple[Any, ...]:
        """A matmul's contracting and batch axes of each side, where each side carries the axis (None where it
        does not), and each side's free axes in order."""
        lhs, rhs = node.ins
        (lc, rc), (lb, rb) = params["dimension_numbers"]
        lc, rc, lb, rb = (tuple(int(x) for x in t) for t in (lc, rc, lb, rb))
        cl = self.get(lhs)[1] if isinstance(lhs, Var) else None
        cr = self.get(rhs)[1] if isinstance(rhs, Var) else None
        lfree = [a for a in range(len(lhs.shape)) if a not in lc + lb]
        rfree = [a for a in range(len(rhs.shape)) if a not in rc + rb]
        return lc, rc, lb, rb, cl, cr, lfree, rfree

    def _dot_general(self, node: Node, params: dict[str, Any], carried: list[tuple[Var, int]]) -> None:
        lhs, rhs = node.ins
        lc, rc, lb, rb, cl, cr, lfree, rfree = self._dot_parts(node, params)
        dl = dr = at = None
        if cl is not None and cl in lb + lc:
            dl = cl
            dr = (rb + rc)[(lb + lc).index(cl)]
            at = lb.index(cl) if cl in lb else None
        elif cr is not None and cr in rb + rc:
            dr = cr
            dl = (lb + lc)[(rb + rc).index(cr)]
            at = rb.index(cr) if cr in rb else None
        elif cl is not None and cr is None:
            dl, at = cl, len(lb) + lfree.index(cl)
        elif cr is not None and cl is None:
            dr, at = cr, len(lb) + len(lfree) + rfree.index(cr)
        else:
            raise Refused("a matmul whose operands carry the axis of one as different axes")
        new_lhs = self.get(lhs)[0] if dl is None else self.without(lhs, dl)
        new_rhs = self.get(rhs)[0] if dr is None else self.without(rhs, dr)
        keep = [k for k in range(len(lb)) if lb[k] != dl]
        keepc = [k for k in range(len(lc)) if lc[k] != dl]
        params["dimension_numbers"] = (
            (_renumber([lc[k] for k in keepc], dl), _renumber([rc[k] for k in keepc], dr)),
            (_renumber([lb[k] for k in keep], dl), _renumber([rb[k] for k in keep], dr)))
        self._emit(node, [new_lhs, new_rhs], params, [at])

    def _top_k(self, node: Node, params: dict[str, Any], carried: list[tuple[Var, int]]) -> None:
        (src, d), = carried
        axis = int(params.get("axis", len(src.shape) - 1))
        if axis == d:
            raise Refused("top_k along the axis of one")
        if "axis" in params:
            params["axis"] = axis - (axis > d)
        self._emit(node, [self.get(src)[0]], params, [d, d])

    def _ragged_dot_general(self, node: Node, params: dict[str, Any], carried: list[tuple[Var, int]]) -> None:
        lhs, rhs, groups = node.ins[:3]
        numbers = params["ragged_dot_dimension_numbers"]
        (lc, rc), (lb, rb) = numbers.dot_dimension_numbers
        lc, rc, lb, rb = (tuple(int(x) for x in t) for t in (lc, rc, lb, rb))
        dl = self.get(lhs)[1] if isinstance(lhs, Var) else None
        if dl is None or dl not in lb or len(carried) != len([op for op in node.ins[:3] if isinstance(op, Var)]):
            raise Refused("a ragged matmul that does not batch over the axis of one")
        k = lb.index(dl)
        dr = rb[k]
        dg = self.get(groups)[1] if isinstance(groups, Var) else None
        if dg is None:
            raise Refused("ragged matmul group sizes without the axis of one")
        keep = [i for i in range(len(lb)) if i != k]
        params["ragged_dot_dimension_numbers"] = type(numbers)(
            dot_dimension_numbers=((_renumber(lc, dl), _renumber(rc, dr)),
                                   (_renumber([lb[i] for i in keep], dl), _renumber([rb[i] for i in keep], dr))),
            lhs_ragged_dimensions=_renumber(numbers.lhs_ragged_dimensions, dl),
            rhs_group_dimensions=_renumber(numbers.rhs_group_dimensions, dr))
        ins = [self.without(lhs, dl), self.without(rhs, dr), self.without(groups, dg),
               *[self.get(op)[0] for op in node.ins[3:]]]
        self._emit(node, ins, params, [k])

    def _gather(self, node: Node, params: dict[str, Any], carried: list[tuple[Var, int]]) -> None:
        src, indices = node.ins[:2]
        for v, _ in carried:  # an axis of one put there by a reshape (the index vector's): back in place
            if v in self.inserted:
                self.restore(v)
        carried = [(v, d) for v, d in carried if self.get(v)[1] is not None]
        if not carried:
            self._copy(node)
            return
        if len(carried) == 2 and src is not indices and {v for v, _ in carried} == {src, indices}:
            self._batched_gather(node, params, dict(carried))
            return
        if len(carried) != 1 or carried[0][0] is not src:
            raise Refused("a gather whose indices carry the axis of one")
        c = carried[0][1]
        numbers = params["dimension_numbers"]
        collapsed = tuple(int(x) for x in numbers.collapsed_slice_dims)
        batching = tuple(int(x) for x in numbers.operand_batching_dims)
        if c in collapsed or c in batching or c in tuple(int(x) for x in numbers.start_index_map):
            raise Refused("a gather that indexes the axis of one")
        offsets = [a for a in range(len(src.shape)) if a not in collapsed and a not in batching]
        at = int(numbers.offset_dims[offsets.index(c)])
        params["dimension_numbers"] = type(numbers)(
            offset_dims=_renumber(tuple(int(x) for x in numbers.offset_dims if int(x) != at), at),
            collapsed_slice_dims=_renumber(collapsed, c),
            start_index_map=_renumber(numbers.start_index_map, c),
            operand_batching_dims=_renumber(batching, c),
            start_indices_batching_dims=tuple(numbers.start_indices_batching_dims))
        params["slice_sizes"] = _drop(params["slice_sizes"], c)
        self._emit(node, [self.get(src)[0], self.get(indices)[0], *[self.get(op)[0] for op in node.ins[2:]]], params, [at])

    def _batched_gather(self, node: Node, params: dict[str, Any], axes: dict[Var, int]) -> None:
        """A gather mapped over the axis of one in both the operand and the indices (``jax.vmap`` of a
        table lookup): the axis is one of its batching dimensions, paired in both; dropped from both."""
        src, indices = node.ins[:2]
        c, ci = axes[src], axes[indices]
        numbers = params["dimension_numbers"]
        batching = tuple(int(x) for x in numbers.operand_batching_dims)
        index_batching = tuple(int(x) for x in numbers.start_indices_batching_dims)
        if c not in batching or index_batching[batching.index(c)] != ci or ci == len(indices.shape) - 1:
            raise Refused("a gather whose indices carry the axis of one")
        j = batching.index(c)
        offset_dims = tuple(int(x) for x in numbers.offset_dims)
        # The result's axes that are not offsets follow the indices' axes, the index vector (last) left out.
        at = [d for d in range(len(node.out.shape)) if d not in offset_dims][ci]
        params["dimension_numbers"] = type(numbers)(
            offset_dims=_renumber(offset_dims, at),
            collapsed_slice_dims=_renumber(numbers.collapsed_slice_dims, c),
            start_index_map=_renumber(numbers.start_index_map, c),
            operand_batching_dims=_renumber(_drop(batching, j), c),
            start_indices_batching_dims=_renumber(_drop(index_batching, j), ci))
        params["slice_sizes"] = _drop(params["slice_sizes"], c)
        self._emit(node, [self.without(src, c), self.without(indices, ci), *[self.get(op)[0] for op in node.ins[2:]]],
                   params, [at])

    def _concatenate(self, node: Node, params: dict[str, Any], carried: list[tuple[Var, int]]) -> None:
        d = self._one_axis(carried)
        if int(params["dimension"]) == d:
            raise Refused("a concatenation along the axis of one")
        params["dimension"] = int(params["dimension"]) - (int(params["dimension"]) > d)
        self._emit(node, [self.without(op, d) for op in node.ins], params, [d])

    def _split(self, node: Node, params: dict[str, Any], carried: list[tuple[Var, int]]) -> None:
        (src, d), = carried
        if int(params["axis"]) == d:
            raise Refused("a split along the axis of one")
        params["axis"] = int(params["axis"]) - (int(params["axis"]) > d)
        self._emit(node, [self.get(src)[0]], params, [d] * len(node.outs))

    def _slice(self, node: Node, params: dict[str, Any], carried: list[tuple[Var, int]]) -> None:
        (src, d), = carried
        for key in ("start_indices", "limit_indices", "strides"):
            if params.get(key) is not None:
                params[key] = _drop(params[key], d)
        self._emit(node, [self.get(src)[0]], params, [d])

    def _pad(self, node: Node, params: dict[str, Any], carried: list[tuple[Var, int]]) -> None:
        (src, d), = carried
        if src is not node.ins[0] or tuple(params["padding_config"][d]) != (0, 0, 0):
            raise Refused("padding along the axis of one")
        params["padding_config"] = _drop(params["padding_config"], d)
        self._emit(node, [self.get(src)[0], self.get(node.ins[1])[0]], params, [d])

    def _rev(self, node: Node, params: dict[str, Any], carried: list[tuple[Var, int]]) -> None:
        (src, d), = carried
        params["dimensions"] = _renumber(tuple(int(x) for x in params["dimensions"] if int(x) != d), d)
        self._emit(node, [self.get(src)[0]], params, [d])

    def _dynamic_slice(self, node: Node, params: dict[str, Any], carried: list[tuple[Var, int]]) -> None:
        src, *starts = node.ins
        d = self.get(src)[1] if isinstance(src, Var) else None
        if d is None or len(carried) != 1:
            raise Refused("dynamic_slice indexed by values that carry the axis of one")
        params["slice_sizes"] = _drop(params["slice_sizes"], d)
        self._emit(node, [self.get(src)[0], *[self.get(s)[0] for s in _drop(starts, d)]], params, [d])

    def _dynamic_update_slice(self, node: Node, params: dict[str, Any], carried: list[tuple[Var, int]]) -> None:
        src, update, *starts = node.ins
        d = self._one_axis(carried)
        if any(isinstance(s, Var) and self.get(s)[1] is not None for s in starts):
            raise Refused("dynamic_update_slice indexed by values that carry the axis of one")
        ins = [self.without(src, d), self.without(update, d), *[self.get(s)[0] for s in _drop(starts, d)]]
        self._emit(node, ins, params, [d])

    # -- the whole program --------------------------------------------------------------------------
    def run(self) -> Program:
        for v in self.old.inputs:
            new = Var(v.name, tuple(v.shape[1:]), v.dtype, v.origin)
            self.new.inputs.append(new)
            self.env[v] = (new, 0)
        for node in self.old.nodes:
            self.visit(node)
        for out in self.old.outputs:
            if not isinstance(out, Var) or not out.shape or out.shape[0] != 1:
                raise Refused("a result without the leading axis of one")
            self.new.outputs.append(self.without(out, 0))
        return collapse_layout(self.new)


def _moves_no_data(node: Node) -> bool:
    """A node whose result is its operand's elements in the same order (a reshape, a squeeze, a transpose
    that only moves axes of one, a broadcast that only inserts them)."""
    src = node.ins[0] if node.ins else None
    if not isinstance(src, Var) or len(node.outs) != 1 or node.out.size != src.size:
        return False
    if node.prim == "reshape":
        return node.params.get("dimensions") is None
    if node.prim == "squeeze":
        return True
    if node.prim == "transpose":
        kept = [a for a in node.params["permutation"] if src.shape[a] != 1]
        return kept == sorted(kept)
    if node.prim == "broadcast_in_dim":
        dims = tuple(node.params["broadcast_dimensions"])
        return len(node.ins) == 1 and dims == tuple(sorted(dims))
    return False


def collapse_layout(program: Program) -> Program:
    """Chains of nodes that move no data (what dropping the axis leaves around a convolution: a reshape that
    puts an axis of one back, a transpose that moves it, a squeeze that takes it out) as one reshape of
    where the chain starts, or nothing where that has the result's shape already."""
    origin: dict[Var, Var] = {}
    kept: list[Node] = []
    for node in program.nodes:
        if not _moves_no_data(node):
            kept.append(node)
            continue
        src = origin.get(node.ins[0], node.ins[0])
        if tuple(src.shape) == tuple(node.out.shape) and src.dtype == node.out.dtype:
            program.substitute(node.out, src)
            continue
        origin[node.out] = src
        if src is node.ins[0]:  # the start of a chain stays as it was written (a broadcast of a bias row)
            kept.append(node)
            continue
        kept.append(Node(lax.reshape_p, [src], list(node.outs), {"new_sizes": tuple(node.out.shape),
                                                                "dimensions": None, "sharding": None},
                         node.source, node.notes))
    program.nodes = kept
    return program.dce()


def has_unit_axis(shapes: Any) -> bool:
    """Whether every one of ``shapes`` leads with an axis of one."""
    return bool(shapes) and all(len(s) >= 1 and s[0] == 1 for s in shapes)


def drop_unit_axis(program: Program) -> Program | str:
    """``program`` without the leading axis of one on every input and output; or why it cannot be."""
    if not has_unit_axis([v.shape for v in program.inputs]):
        return "not every argument leads with an axis of one"
    try:
        return LayoutRebuild(program).run()
    except Refused as exc:
        return str(exc)
