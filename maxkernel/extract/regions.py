"""Finding the regions of a layer: contiguous runs of its flat program that each deserve a kernel.

A region is built around an anchor: an attention (from the projections that feed the scores to the output
projection and its residual), a matmul (with the elementwise prologue that feeds it and the epilogue that
follows), a normalization (a sum over the last axis followed by rsqrt), a routing step (top_k) or a scan.
Regions are cut so that together they cover every node of the program in order, which is what lets the
re-joined regions reproduce the layer.
"""

from __future__ import annotations

from dataclasses import dataclass

from maxkernel.analysis.graph import ELEMENTWISE, PLUMBING
from maxkernel.analysis.program import Node, Program, Var

MATMULS = {"dot_general", "ragged_dot_general"}
CHEAP = ELEMENTWISE | PLUMBING | {"slice", "concatenate", "pad", "select_n", "squeeze", "expand_dims", "iota"}


@dataclass
class Span:
    """Nodes ``start`` to ``end`` (exclusive) of a program, and what the region does."""

    start: int
    end: int
    kind: str
    core: tuple[int, int] | None = None  # an attention's first score matmul and its value matmul


def _producers(program: Program) -> dict[Var, int]:
    return {out: i for i, node in enumerate(program.nodes) for out in node.outs}


def _nearest_dots(program: Program, index: int, producers: dict[Var, int]) -> set[int]:
    """Matmuls reached from node ``index``'s operands through cheap nodes only."""
    found: set[int] = set()
    stack = [op for op in program.nodes[index].ins if isinstance(op, Var)]
    seen: set[int] = set()
    while stack:
        at = producers.get(stack.pop())
        if at is None or at in seen:
            continue
        seen.add(at)
        node = program.nodes[at]
        if node.prim in MATMULS:
            found.add(at)
        elif node.prim in CHEAP or node.prim in ("reduce_max", "reduce_sum", "exp"):
            stack.extend(op for op in node.ins if isinstance(op, Var))
    return found


def _users(program: Program) -> dict[Var, list[int]]:
    found: dict[Var, list[int]] = {}
    for i, node in enumerate(program.nodes):
        for op in node.ins:
            if isinstance(op, Var):
                found.setdefault(op, []).append(i)
    return found


def _next_dot(program: Program, index: int, users: dict[Var, list[int]], through: set[str]) -> int | None:
    """The first matmul fed by node ``index`` through nodes whose primitive is in ``through``."""
    stack, seen, best = [index], set(), None
    while stack:
        at = stack.pop()
        for out in program.nodes[at].outs:
            for user in users.get(out, []):
                if user in seen:
                    continue
                seen.add(user)
                prim = program.nodes[user].prim
                if prim in MATMULS:
                    best = user if best is None else min(best, user)
                elif prim in through:
                    stack.append(user)
    return best


def _attention_spans(program: Program) -> list[Span]:
    """Softmax between two matmuls: scores -> exp -> weighted values, widened to projections and output."""
    producers, users = _producers(program), _users(program)
    spans: list[Span] = []
    for i, node in enumerate(program.nodes):
        if node.prim != "exp" or any(s.start <= i < s.end for s in spans):
            continue
        scores = _nearest_dots(program, i, producers)
        if not scores:
            continue
        values = _next_dot(program, i, users, CHEAP | {"reduce_sum", "reduce_max", "div"})
        if values is None:
            continue
        projections = set().union(*(_nearest_dots(program, s, producers) for s in scores | {values}))
        projections -= scores
        start = min(projections | scores)
        out_proj = _next_dot(program, values, users, PLUMBING | {"transpose", "reshape"})
        end = (out_proj if out_proj is not None else values) + 1
        spans.append(Span(start, _extend_epilogue(program, start, end), "attention", (min(scores), values)))
    return spans


def _extend_epilogue(program: Program, start: int, end: int) -> int:
    """Grow ``end`` over the cheap nodes right after it that consume what the span made (bias, residual)."""
    made = {out for node in program.nodes[start:end] for out in node.outs}
    while end < len(program.nodes):
        node = program.nodes[end]
        if node.prim not in CHEAP or not any(isinstance(op, Var) and op in made for op in node.ins):
            break
        made.update(node.outs)
        end += 1
    return end


def _anchor_kind(program: Program, i: int) -> str | None:
    node = program.nodes[i]
    if node.prim in MATMULS:
        return "matmul"
    if node.prim == "top_k":
        return "routing"
    if node.prim in ("scan", "while"):
        return "scan"
    if node.prim == "conv_general_dilated":
        return "conv"
    if node.prim == "reduce_sum" and any(n.prim == "rsqrt" for n in program.nodes[i + 1 : i + 5]):
        return "norm"
    return None


def _prologue_start(program: Program, anchor: int, floor: int) -> int:
    """Walk back over cheap nodes whose results all feed the nodes between them and the anchor."""
    users = _users(program)
    start = anchor
    while start - 1 >= floor:
        node = program.nodes[start - 1]
        if node.prim not in CHEAP:
            break
        if not all(any(start - 1 < u <= anchor for u in users.get(out, [])) for out in node.outs):
            break
        start -= 1
    return start


def _operands(node: Node) -> set[Var]:
    return {op for op in node.ins if isinstance(op, Var)}


def find_regions(program: Program) -> list[Span]:
    """Cut the program into regions covering every node, in program order."""
    attention = _attention_spans(program)
    anchors: list[tuple[int, int, str]] = [(s.start, s.end, s.kind) for s in attention]
    cores = {s.start: s.core for s in attention}
    i = 0
    while i < len(program.nodes):
        inside = next((s for s in attention if s.start <= i < s.end), None)
        if inside is not None:
            i = inside.end
            continue
        kind = _anchor_kind(program, i)
        if kind is None:
            i += 1
            continue
        end = _extend_epilogue(program, i, i + 1) if kind == "norm" else i + 1
        anchors.append((i, end, kind))
        i = end
    anchors.sort()
    merged: list[tuple[int, int, str]] = []
    for a in anchors:
        if merged and a[2] == "matmul" and merged[-1][2] == "matmul":
            prev = _operands(program.nodes[merged[-1][1] - 1])
            if prev & _operands(program.nodes[a[0]]):  # x @ Wa, x @ Wb: one region
                merged[-1] = (merged[-1][0], a[1], "matmul")
                continue
        merged.append(a)
    if not merged:
        return [Span(0, len(program.nodes), "elementwise")]
    starts = [0]
    for (a_start, _, _), (_, prev_end, _) in zip(merged[1:], merged[:-1]):
        starts.append(max(_prologue_start(program, a_start, prev_end), starts[-1] + 1))
    ends = starts[1:] + [len(program.nodes)]
    return [Span(s, e, kind, cores.get(a) if kind == "attention" else None)
            for s, e, (a, _, kind) in zip(starts, ends, merged)]



def merge_routed(spans: list[Span]) -> list[Span]:
    """A routing step and the regions after it up to its last expert region as one region: the expert
    matmuls (the dense gate and up products over every expert included) then read the routing that picks
    their tokens, so a kernel can run each token through its chosen experts only (the dense reference runs
    every expert on every token and zeroes the others)."""
    merged: list[Span] = []
    i = 0
    while i < len(spans):
        span = spans[i]
        if span.kind == "routing":
            run = i + 1
            while run < len(spans) and spans[run].kind in ("matmul", "experts"):
                run += 1
            last = max((j for j in range(i + 1, run) if spans[j].kind == "experts"), default=None)
            if last is not None:
                merged.append(Span(span.start, spans[last].end, "experts"))
                i = last + 1
                continue
        merged.append(span)
        i += 1
    return merged
