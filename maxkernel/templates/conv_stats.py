"""Norm statistics of a convolution's output read from per-channel sums the kernel writes beside it.

A norm after a convolution (GroupNorm, BatchNorm, InstanceNorm) reduces its input ``a`` over all
positions (and over batch or a group of channels): ``sum(a)`` and ``sum((a - m)**2)`` with ``m`` constant
along the reduced axes. Unfused, XLA reads the convolution's output once per reduction and once more to
normalize. Here the tail is split in two:
- the *prefix*: ``a`` computed per position from the convolution's output with per-channel operands only
  (a bias, an activation), fused on the kernel's accumulator; the kernel also writes, per block, the f32
  sums of ``a`` and of ``a * a`` over the block's positions for each (sample, channel);
- the *finish*: the rest of the reference, in which each such reduction reads those sums instead of the
  output: ``sum(a) = S`` and ``sum((a - m)**2) = Q - 2 m S + N m**2`` (N the number of elements reduced),
  summed over the reduction's other axes. What is left reads ``a`` in one pass (the normalize, the
  elementwise tail, a final reduction), which XLA fuses.
The sums are f32 and accumulated in f32; the variance is then a difference of f32 sums, which the
evaluator's check at the task's tolerance decides.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from jax import lax

from maxkernel.analysis.graph import ELEMENTWISE
from maxkernel.analysis.program import Const, Node, Operand, Program, Var
from maxkernel.rewrites.build import Splice, scalar

SQUARE = "square"


@dataclass
class StatsSplit:
    """The tail as a fused prefix and an XLA finish that reads per-channel sums."""

    prefix: Program  # inputs: the convolution's output, then per-channel operands -> ``a``
    finish: Program  # inputs: ``a``, its sums, its sums of squares, the positions each sum counts, then the
    # other operands it reads
    replaced: int  # reductions of the output now read from the sums


@dataclass
class _Reduction:
    node: Node
    base: Var  # the value summed, before any reshape
    view: tuple[int, ...]  # its shape as the reduction sees it
    squared: bool
    centre: Operand | None  # ``m`` of ``(a - m)**2``
    trailing: int  # the view's last axes that hold the positions


def _squared_operand(node: Node | None) -> Operand | None:
    """``x`` when ``node`` computes ``x * x``."""
    if node is None:
        return None
    if node.prim == SQUARE or (node.prim == "integer_pow" and int(node.params.get("y", 0)) == 2):
        return node.ins[0]
    if node.prim == "mul" and node.ins[0] is node.ins[1]:
        return node.ins[0]
    return None


def _reduction(node: Node, producers: dict[Var, Node], nd: int) -> _Reduction | None:
    """The sum (of squares, centred) of the convolution's positions that ``node`` computes, if it is one."""
    if node.prim != "reduce_sum" or not isinstance(node.ins[0], Var):
        return None
    view_var = node.ins[0]
    axes = tuple(int(a) for a in node.params["axes"])
    squared, centre = False, None
    inner = _squared_operand(producers.get(view_var))
    if inner is not None:
        squared = True
        sub = producers.get(inner) if isinstance(inner, Var) else None
        if sub is not None and sub.prim == "sub":
            inner, centre = sub.ins
        if not isinstance(inner, Var):
            return None
        view_var = inner
    view = tuple(view_var.shape)
    base = view_var
    while base in producers and producers[base].prim == "reshape" and isinstance(producers[base].ins[0], Var):
        base = producers[base].ins[0]  # type: ignore[assignment]
    rank = len(view)
    trailing = _position_axes(view, tuple(base.shape), nd)
    if trailing is None or not set(range(rank - trailing, rank)) <= set(axes):
        return None  # the sum must span every position
    if centre is not None:
        if isinstance(centre, Const):
            if centre.shape != ():
                return None
        elif len(centre.shape) != rank or any(
                (e != 1) if a in axes else (e != v) for a, (e, v) in enumerate(zip(centre.shape, view))):
            return None
    return _Reduction(node, base, view, squared, centre, trailing)


def _position_axes(view: tuple[int, ...], shape: tuple[int, ...], nd: int) -> int | None:
    """How many trailing axes of ``view`` (a row-major reshape of ``shape`` [N, C, *positions]) hold the
    positions: the fewest whose product is theirs, the axes before them splitting or merging N and C only."""
    if len(shape) != nd + 2:
        return None
    positions = int(np.prod(shape[2:]))
    for k in range(1, len(view)):
        if int(np.prod(view[-k:])) == positions and int(np.prod(view[:-k])) == shape[0] * shape[1]:
            return k
    return None


def _per_position(prefix: Program, h: Var, o: int) -> bool:
    """Whether ``prefix`` computes each position from that position of ``h`` and per-channel operands."""
    if any(n.prim not in ELEMENTWISE and n.prim != "broadcast_in_dim" for n in prefix.nodes):
        return False
    users = prefix.users()
    for v in prefix.inputs[1:]:
        for node in users.get(v, []):
            if node.prim != "broadcast_in_dim":
                return False
            shape, dims = tuple(node.params["shape"]), tuple(node.params["broadcast_dimensions"])
            if shape != (1, o) + (1,) * (len(shape) - 2) or any(e != 1 and d != 1 for e, d in zip(v.shape, dims)):
                return False
        if int(np.prod(v.shape)) != o:
            return False
    return all(n.out.shape == h.shape or n.prim == "broadcast_in_dim" for n in prefix.nodes)


def split(tail: Program, o: int, nd: int) -> StatsSplit | None:
    """The split of ``tail`` (inputs: the convolution's output ``h``, then its operands) around the norm
    input its position-spanning reductions read, or None where no reduction reads one."""
    h = tail.inputs[0]
    producers = tail.producers()
    found = [r for r in (_reduction(n, producers, nd) for n in tail.nodes) if r is not None]
    if not found:
        return None
    counts: dict[int, int] = {}
    for r in found:
        counts[id(r.base)] = counts.get(id(r.base), 0) + 1
    best = max(counts, key=lambda k: counts[k])
    found = [r for r in found if id(r.base) == best and r.base.dtype == np.float32]
    if not found:
        return None
    a = found[0].base
    if a.shape != h.shape:
        return None
    ancestry = tail.ancestors(a)
    inside = {id(n) for n in ancestry}
    reads = [v for v in tail.inputs[1:] if any(v in n.ins for n in ancestry)]
    prefix = Program([h] + reads, [Node(n.primitive, list(n.ins), list(n.outs), dict(n.params)) for n in ancestry],
                     [a], None, tail._counter, dict(tail.dim_names))
    if not _per_position(prefix, h, o):
        return None
    computed = {out for n in ancestry for out in n.outs}
    rest = [n for n in tail.nodes if id(n) not in inside]
    if any(v in computed and v is not a or v is h and a is not h for n in rest for v in n.ins):
        return None  # the finish reads a value of the prefix other than its result
    stats_shape = (h.shape[0], o) + (1,) * nd
    sums = Var("sums", stats_shape, np.dtype(np.float32))
    squares = Var("squares", stats_shape, np.dtype(np.float32))
    counts = Var("counts", stats_shape, np.dtype(np.float32))
    others = [v for v in tail.inputs[1:] if any(v in n.ins for n in rest)]
    finish = Program([a, sums, squares, counts] + others,
                     [Node(n.primitive, list(n.ins), list(n.outs), dict(n.params), n.source) for n in rest],
                     list(tail.outputs), tail.out_tree, tail._counter, dict(tail.dim_names))
    twins = [finish.nodes[rest.index(r.node)] for r in found]  # before any splice moves them
    counted = {}
    for r, copied in zip(found, twins):
        result, count = _read_from_sums(finish, copied, r, (sums, squares, counts), nd)
        counted[result] = (count, float(np.prod([r.view[ax] for ax in copied.params["axes"]])))
    _divide_by_counts(finish, counted)
    finish.dce()
    if any(n.prim == "reduce_sum" and n.ins[0] is a for n in finish.nodes):
        return None
    return StatsSplit(prefix, finish, len(found))


def _read_from_sums(program: Program, node: Node, r: _Reduction, stats: tuple[Var, Var, Var],
                    nd: int) -> tuple[Var, Var]:
    """Replace the reduction ``node`` by the same reduction of the per-channel sums; returns its result and
    the number of elements it reduced, as the same reduction of the positions each sum counts (an operand,
    so that the finish holds at every batch size, not only at the one it was written from)."""
    sums, squares, counts = stats
    splice = Splice(program)
    axes = tuple(int(a) for a in node.params["axes"])
    view = r.view[:-r.trailing] + (1,) * r.trailing

    def reduced(stat: Var) -> Operand:
        return splice.reduce_sum(splice.reshape(stat, view), axes)

    count = reduced(counts)
    assert isinstance(count, Var)

    if not r.squared:
        result = reduced(sums)
    elif r.centre is None:
        result = reduced(squares)
    else:
        m: Operand = r.centre
        if isinstance(m, Var):  # squeezed, not reshaped: no extent of the traced size is written down
            m = splice.add(lax.squeeze_p, [m], dimensions=axes)
        q, s = reduced(squares), reduced(sums)
        twice = splice.mul(splice.mul(s, m), scalar(2.0, np.float32))
        spread = splice.mul(splice.mul(m, m), count)
        result = splice.add(lax.add_p, [splice.add(lax.sub_p, [q, twice]), spread])
    if not isinstance(result, Var):
        raise ValueError("a reduction of the sums folded to a constant")
    splice.commit(node, result)
    return result, count


LAYOUT = ("broadcast_in_dim", "reshape", "expand_dims", "squeeze")


def _divide_by_counts(program: Program, counted: dict[Var, tuple[Var, float]]) -> None:
    """A mean divides a replaced sum by the number it reduced, a literal at the size it was traced at:
    divide by that count as an operand instead (laid out as the sum is on the way to the division)."""
    producers = program.producers()
    for node in list(program.nodes):
        if node.prim != "div" or not isinstance(node.ins[0], Var) or not isinstance(node.ins[1], Const):
            continue
        chain: list[Node] = []
        source = node.ins[0]
        while source not in counted and source in producers and producers[source].prim in LAYOUT:
            chain.append(producers[source])
            source = producers[source].ins[0]  # type: ignore[assignment]
        if source not in counted or node.ins[1].shape or float(node.ins[1].value) != counted[source][1]:
            continue
        splice = Splice(program)
        divisor: Operand = counted[source][0]
        for step in reversed(chain):
            divisor = splice.add(step.primitive, [divisor] + list(step.ins[1:]), **step.params)
        out = splice.add(node.primitive, [node.ins[0], divisor])
        splice.commit(node, out)
