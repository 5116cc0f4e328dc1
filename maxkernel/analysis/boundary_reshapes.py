"""Reshapes at a computation's edges: arguments it reads only reshaped, results it reshapes last.

A caller that keeps a batch merged into the rows (``x`` as ``[batch * n]`` and ``x.reshape(batch, n)``
inside), or rows merged into a batch, hands the computation its arguments in one layout and the work sees
them in another. Those reshapes move no data (XLA does them in place or as one copy either side), so the
work is the program between them. :func:`boundary_reshapes` finds them on the traced program;
:func:`between_reshapes` is the program without them; :func:`edge_programs` are the reshapes alone, at the
edges, for the candidate's ``kernel`` to do.
"""

from __future__ import annotations

import jax

from maxkernel.analysis.program import Node, Program, Var
from maxkernel.analysis.unit_axis import collapse_layout


def _is_reshape(node: Node) -> bool:
    return node.prim == "reshape" and node.params.get("dimensions") is None


def boundary_reshapes(program: Program) -> tuple[dict[int, Node], dict[int, Node]]:
    """(argument index -> the one reshape that reads it, result index -> the reshape that makes it): an
    argument every use of which is one reshape, a result made by a reshape of a value nothing else reads."""
    users = program.users()
    producers = program.producers()
    entries: dict[int, Node] = {}
    for i, v in enumerate(program.inputs):
        used = users.get(v, [])
        if len(used) == 1 and _is_reshape(used[0]) and v not in program.outputs and used[0].out not in program.outputs:
            entries[i] = used[0]
    exits: dict[int, Node] = {}
    for i, out in enumerate(program.outputs):
        node = producers.get(out) if isinstance(out, Var) else None
        if node is None or not _is_reshape(node) or any(node is e for e in entries.values()):
            continue
        src = node.ins[0]
        if isinstance(src, Var) and src not in program.inputs and len(users.get(src, [])) == 1 \
                and sum(o is out for o in program.outputs) == 1 and src not in program.outputs:
            exits[i] = node
    return entries, exits


def between_reshapes(program: Program, entries: dict[int, Node], exits: dict[int, Node]) -> Program:
    """``program`` taking its arguments already reshaped and giving its results before their last reshape."""
    view = program.copy()
    keep = {id(n) for n in entries.values()} | {id(n) for n in exits.values()}
    nodes = {id(n): m for n, m in zip(program.nodes, view.nodes)}
    view.nodes = [m for n, m in zip(program.nodes, view.nodes) if id(n) not in keep]
    for i, node in entries.items():
        old = view.inputs[i]
        new = Var(old.name, tuple(node.out.shape), old.dtype, old.origin)
        view.inputs[i] = new
        view.substitute(node.out, new)
    for i, node in exits.items():
        view.outputs[i] = nodes[id(node)].ins[0]
    return collapse_layout(view.dce())


def edge_programs(program: Program, entries: dict[int, Node], exits: dict[int, Node]) -> tuple[Program, Program]:
    """The reshapes alone: (the arguments -> the view's arguments, the view's results and the arguments ->
    the results), each a program an emitter writes out."""
    into = Program(list(program.inputs), [entries[i] for i in sorted(entries)],
                   [entries[i].out if i in entries else v for i, v in enumerate(program.inputs)],
                   jax.tree_util.tree_structure(tuple(program.inputs)), program._counter, dict(program.dim_names))
    results = [Var(f"result{i}" if len(program.outputs) > 1 else "result", tuple(exits[i].ins[0].shape if i in exits else out.shape),
                   exits[i].ins[0].dtype if i in exits else out.dtype) for i, out in enumerate(program.outputs)]
    nodes = [Node(exits[i].primitive, [results[i]], list(exits[i].outs), dict(exits[i].params)) for i in sorted(exits)]
    back = Program(results + list(program.inputs), nodes,
                   [exits[i].out if i in exits else results[i] for i in range(len(program.outputs))],
                   program.out_tree, program._counter, dict(program.dim_names))
    return into, back
