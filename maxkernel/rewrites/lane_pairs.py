"""Interleaved pairs computed lane-dense: ``x.reshape(..., h, 2)``, a function of each pair, stacked back.

Interleaved rotary embedding (and any op on adjacent element pairs) is written by splitting the last axis
into pairs, computing from each pair's two elements, stacking the two results and merging the axes again.
On a TPU that layout has a minor axis of 2: every vector register holds 2 useful lanes of 128, so the
reference moves and computes 64 times what it needs. The same arithmetic on the merged axis, every lane
reading its partner through a one-lane shift, touches only dense tiles:

    a = where(even lane, x, x shifted right by one lane)    # each lane's pair's first element
    b = where(even lane, x shifted left by one lane, x)     # and its second
    out = where(even lane, first result(a, b, ...), second result(a, b, ...))

Values of ``h`` the pair function reads from outside (a rotary embedding's cos and sin per pair) are
repeated once per lane of their pair. Both results are computed on every lane (twice the arithmetic of
the reference, on a 64th of the tiles).

The general rules apply it before they plan a kernel, where the tiles are what is priced. As a plain-JAX
rewrite it does not pay: XLA:TPU prices the shifted copies above the reference's own layout (0.46x on a
drawn interleaved rotary embedding, against 4.5x for the general rules' kernel with it).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from maxkernel.analysis.graph import ELEMENTWISE
from maxkernel.analysis.program import Node, Operand, Program, Var
from maxkernel.rewrites.build import inline_traced, make

NOTE = ("the interleaved pairs on the merged last axis: each lane reads its partner through a one-lane shift "
        "(a minor axis of 2 fills 2 lanes of 128)")


def _even_lanes(shape: tuple[int, ...]) -> Any:
    return jax.lax.rem(jax.lax.broadcasted_iota(jnp.int32, shape, len(shape) - 1), 2) == 0


def _partners(x: Any) -> tuple[Any, Any]:
    """Each lane's pair's first and second element, on the merged axis."""
    even = _even_lanes(x.shape)
    after = jnp.concatenate([x[..., 1:], x[..., :1]], axis=-1)  # lane l holds x[l + 1]
    before = jnp.concatenate([x[..., -1:], x[..., :-1]], axis=-1)  # lane l holds x[l - 1]
    return jnp.where(even, x, before), jnp.where(even, after, x)


def _interleave(first: Any, second: Any) -> Any:
    return jnp.where(_even_lanes(first.shape), first, second)


def _repeat_pairs(v: Any) -> Any:
    return jnp.repeat(v, 2, axis=-1)


def _unit_last(program: Program, var: Var, users: dict[Var, list[Node]]) -> Var | None:
    """The value ``var`` (a slice of shape [..., 1]) is read as, with the unit axis dropped; None if it is
    read any other way."""
    readers = users.get(var, [])
    if len(readers) != 1 or var in program.outputs:
        return None
    node = readers[0]
    rank = len(var.shape)
    if node.prim == "squeeze" and tuple(node.params["dimensions"]) == (rank - 1,):
        return node.out
    if node.prim == "reshape" and tuple(node.out.shape) == tuple(var.shape[:-1]):
        return node.out
    return None


def _pair_halves(program: Program, q: Var, users: dict[Var, list[Node]]) -> tuple[Var, Var] | None:
    """The pairs' first and second elements, if ``q`` ([..., h, 2]) is read only as those two."""
    halves: dict[int, Var] = {}
    rank = len(q.shape)
    for node in users.get(q, []):
        if node.prim != "slice" or any(int(s) != 1 for s in node.params.get("strides") or ()):
            return None
        start, limit = tuple(node.params["start_indices"]), tuple(node.params["limit_indices"])
        if any(start[a] != 0 or limit[a] != q.shape[a] for a in range(rank - 1)) or limit[-1] - start[-1] != 1:
            return None
        half = _unit_last(program, node.out, users)
        if half is None or int(start[-1]) in halves:
            return None
        halves[int(start[-1])] = half
    if set(halves) != {0, 1} or q in program.outputs:
        return None
    return halves[0], halves[1]


def _stacked_pairs(program: Program, q_shape: tuple[int, ...]) -> list[tuple[Node, Node, Var, Var]]:
    """Every ``stack(first, second)`` on a new last axis merged right away into [..., 2h]: the stack, the
    merging reshape, and the two results."""
    users = program.users()
    found = []
    for node in program.nodes:
        if node.prim != "stack" or len(node.ins) != 2 or tuple(node.out.shape) != q_shape:
            continue
        if int(node.params["axis"]) != len(q_shape) - 1:
            continue
        readers = users.get(node.out, [])
        if len(readers) != 1 or node.out in program.outputs:
            continue
        merge = readers[0]
        if merge.prim != "reshape" or tuple(merge.out.shape) != q_shape[:-2] + (2 * q_shape[-2],):
            continue
        first, second = node.ins
        if isinstance(first, Var) and isinstance(second, Var):
            found.append((node, merge, first, second))
    return found


def _region(program: Program, sources: set[Var], sinks: list[Var]) -> list[Node] | None:
    """The nodes between ``sources`` and ``sinks`` (in program order): those that read a source (or what
    one computes) and that the sinks are computed from."""
    reached: set[Var] = set(sources)
    below: list[Node] = []
    for node in program.nodes:
        if any(isinstance(op, Var) and op in reached for op in node.ins):
            below.append(node)
            reached.update(node.outs)
    above: set[int] = set()
    for sink in sinks:
        above.update(id(nd) for nd in program.ancestors(sink))
    region = [nd for nd in below if id(nd) in above]
    return region if all(sink in reached for sink in sinks) else None


def _pair_op(program: Program, reshape: Node) -> tuple[Var, list[Node], Var, Var, Var, Var, Node, Node] | None:
    """The site around one splitting reshape: x, the pair function's nodes, its two inputs and two
    results, the stack and the merging reshape; None where the pattern does not hold exactly."""
    x, q = reshape.ins[0], reshape.out
    if not isinstance(x, Var) or len(x.shape) < 1 or len(q.shape) != len(x.shape) + 1:
        return None
    h = int(x.shape[-1]) // 2
    if int(x.shape[-1]) != 2 * h or h < 2 or tuple(q.shape) != tuple(x.shape[:-1]) + (h, 2):
        return None
    users = program.users()
    halves = _pair_halves(program, q, users)
    if halves is None:
        return None
    a, b = halves
    for stack, merge, first, second in _stacked_pairs(program, tuple(q.shape)):
        region = _region(program, {a, b}, [first, second])
        if region is None:
            continue
        inside = {out for nd in region for out in nd.outs} | {a, b}
        if any(nd.prim not in ELEMENTWISE for nd in region):
            continue
        if any(out.shape[-1:] != (h,) for nd in region for out in nd.outs):
            continue
        escapes = any(u not in region and u is not stack for v in inside for u in users.get(v, [])) or any(
            op in inside for op in program.outputs)
        if escapes:
            continue
        outside = {op for nd in region for op in nd.ins if isinstance(op, Var) and op not in inside}
        if any(v.shape and v.shape[-1] not in (1, h) for v in outside):
            continue
        return x, region, a, b, first, second, stack, merge
    return None


def lane_pairs(program: Program) -> int:
    """Every interleaved-pair site, computed on the merged axis."""
    count = 0
    for reshape in list(program.nodes):
        if reshape.prim != "reshape" or reshape not in program.nodes:
            continue
        site = _pair_op(program, reshape)
        if site is None:
            continue
        x, region, a, b, first, second, _, merge = site
        h = int(x.shape[-1]) // 2
        new: list[Node] = []
        nodes, (wide_a, wide_b) = inline_traced(program, _partners, [x])
        new += nodes
        mapped: dict[Var, Operand] = {a: wide_a, b: wide_b}
        for node in region:
            ins: list[Operand] = []
            for op in node.ins:
                if isinstance(op, Var) and op not in mapped and op.shape and op.shape[-1] == h:
                    nodes, (mapped[op],) = inline_traced(program, _repeat_pairs, [op])
                    new += nodes
                ins.append(mapped.get(op, op) if isinstance(op, Var) else op)
            built, out = make(program, node.primitive, ins, **node.params)
            built.source, built.notes = node.source, node.notes
            new.append(built)
            mapped[node.out] = out
        wide_first, wide_second = mapped[first], mapped[second]
        assert isinstance(wide_first, Var) and isinstance(wide_second, Var)
        nodes, (result,) = inline_traced(program, _interleave, [wide_first, wide_second])
        new += nodes
        new[0].notes = (*new[0].notes, NOTE)
        if isinstance(result, Var) and result.dtype == merge.out.dtype and result.shape == merge.out.shape:
            new[-1].source = merge.source
            index = program.nodes.index(merge)
            program.nodes[index:index] = new
            program.substitute(merge.out, result)
            program.dce()
            count += 1
    return count


__all__ = ["NOTE", "lane_pairs"]
