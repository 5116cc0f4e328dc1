"""A region as a program of its own: the values it reads from before it, its nodes, the values it hands on."""

from __future__ import annotations

import jax

from maxkernel.analysis.program import Program, Var
from maxkernel.extract.regions import Span


def region_program(program: Program, span: Span) -> Program:
    """The nodes of ``span`` with their outside inputs as arguments.

    Values made before the region from constants alone (iotas, masks, RoPE tables) are recomputed inside
    it, so a region's arguments are only what the layer's inputs really decide.
    """
    nodes = program.nodes[span.start : span.end]
    made = {out for node in nodes for out in node.outs}
    later = {op for node in program.nodes[span.end :] for op in node.ins if isinstance(op, Var)}
    later.update(op for op in program.outputs if isinstance(op, Var))
    inputs: list[Var] = []
    pulled: list = []
    for node in nodes:
        for op in node.ins:
            if isinstance(op, Var) and op not in made and op not in inputs:
                if op not in program.inputs and not program.reads(op):
                    for anc in program.ancestors(op):
                        if all(anc is not p for p in pulled):
                            pulled.append(anc)
                    made.add(op)
                else:
                    inputs.append(op)
    order = {id(n): i for i, n in enumerate(program.nodes)}
    pulled.sort(key=lambda n: order[id(n)])
    outputs = [out for node in nodes for out in node.outs if out in later]
    sub = Program(inputs, pulled + list(nodes), list(outputs))
    sub.out_tree = jax.tree_util.tree_structure(tuple(outputs)) if len(outputs) > 1 else None
    return sub


def prefix_program(program: Program, needed: list[Var]) -> Program:
    """The layer's inputs to ``needed``: the computation a region's ``get_inputs`` runs before it."""
    sub = Program(list(program.inputs), list(program.nodes), list(needed))
    sub.dce()
    sub.out_tree = jax.tree_util.tree_structure(tuple(needed))
    return sub
