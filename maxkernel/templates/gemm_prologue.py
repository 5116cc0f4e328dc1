"""Random draws of a GEMM's epilogue taken out of it and made in XLA before the kernels.

A tail that draws random bits (dropout's keep mask) cannot run per block: bits drawn per block are not the
reference's draws over the whole product. But the draws never read the product; only their shape follows
it. So the part of the tail that depends on a draw and not on the product (bits -> uniform -> keep mask) is
split off as a *prologue*, run by XLA with the reference's own ``jax.random`` calls, and its results become
inputs of the rest of the tail, which then reads them as blocks like any other operand (a row-reducing
tail runs in the row-block kernel instead of XLA: 38k's dropout + softmax).

A boolean result travels as int8 (one byte an element; Mosaic has no boolean memory) and is compared with
zero where the tail reads it. The prologue's first input is the product's shape (a ``ShapeDtypeStruct``)
so that its draws read their extents from it, as the tail's did from the product.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import numpy as np
from jax import lax

from maxkernel.analysis.program import Node, Program, Var
from maxkernel.rewrites.build import make, scalar

DRAWN = "drawn"  # names of the prologue's results, as the kernel's source holds them: drawn_0, drawn_1, ...


@dataclass
class Prologue:
    """The tail's draws, computed apart: ``program``'s inputs are the product ``h`` (read for its shape
    only) then the inputs it reads; its outputs are the tail's inputs named ``drawn_<i>``."""

    program: Program
    outputs: list[Var]  # as the tail reads them (int8 for a boolean draw)


def _random(node: Node) -> bool:
    return node.prim.startswith("random")


def split_draws(tail: Program) -> Prologue | None:
    """Split ``tail`` (inputs: ``h`` then others) in place into a prologue and the rest, or None when it
    draws nothing. The rest reads the prologue's results as new inputs after its own."""
    if not any(_random(n) for n in tail.nodes):
        return None
    h = tail.inputs[0]
    on_h: set[Var] = {h}
    drawn: set[Var] = set()
    for node in tail.nodes:
        reads = [op for op in node.ins if isinstance(op, Var)]
        if any(v in on_h for v in reads):
            on_h.update(node.outs)
        elif _random(node) or any(v in drawn for v in reads):
            drawn.update(node.outs)
    if any(v in drawn for v in tail.outputs if isinstance(v, Var)):
        return None  # the output itself is a draw: nothing of the product left to block
    users = tail.users()
    boundary = [v for node in tail.nodes for v in node.outs
                if v in drawn and any(u.outs[0] not in drawn for u in users.get(v, []))]
    pre = tail.copy()
    drawn_nodes = {id(n) for n in tail.nodes if n.outs[0] in drawn}
    tail.nodes = [n for n in tail.nodes if id(n) not in drawn_nodes]
    results: list[Var] = []
    carried: list[Var] = []
    for i, var in enumerate(boundary):
        read = Var(f"{DRAWN}_{i}", var.shape, np.dtype("int8") if var.dtype == np.dtype(bool) else var.dtype)
        if read.dtype != var.dtype:
            node, out = make(pre, lax.convert_element_type_p, [var], new_dtype=read.dtype, weak_type=False,
                             sharding=None)
            pre.nodes.append(node)
            results.append(out)
            tail.nodes.insert(0, Node(lax.ne_p, [read, scalar(0, read.dtype)], [var], {}))
        else:
            results.append(var)
            tail.substitute(var, read)
        carried.append(read)
    pre.outputs = list(results)
    pre.out_tree = jax.tree_util.tree_structure(tuple(range(len(results))))  # a tuple, however many
    pre.dce()
    pre.inputs = [h] + [v for v in pre.inputs[1:] if any(v in n.ins for n in pre.nodes)]
    tail.dce()
    kept = [v for v in tail.inputs[1:] if any(v in n.ins for n in tail.nodes) or v in tail.outputs]
    tail.inputs = [h] + kept + carried
    return Prologue(pre, carried)
