"""What a softmax attention's output goes through before it is returned: read from the traced program, so
an attention kernel either computes the whole reference or says why it cannot.

The attention ends at its second matmul, divided by the softmax's row sums when they are applied after it,
and cast once (the output dtype). Anything after that is the *tail*: an output gate such as
``o * sigmoid(o)``, a scale, a clamp. A tail of elementwise ops that reads the attention's result alone
(constants aside) runs in XLA on the kernel's output; any other tail (a reduction, another input) is
refused, so no kernel that leaves out part of the computation is ever proposed.
"""

from __future__ import annotations

from maxkernel.analysis.graph import ELEMENTWISE
from maxkernel.analysis.program import Node, Program, Var

# Besides elementwise ops, a tail may broadcast a scalar constant to the output's shape.
TAIL_PLUMBING = ("broadcast_in_dim",)


def split_after_attention(program: Program) -> tuple[Var, Program | None] | str:
    """The attention's own result and the tail program from it to the output (None when it is the output),
    or why the output is something else than an elementwise function of the attention's result."""
    dots = [n for n in program.nodes if n.prim == "dot_general"]
    if len(dots) != 2 or len(program.outputs) != 1 or not isinstance(program.outputs[0], Var):
        return "not one output after two matmuls"
    output = program.outputs[0]
    users = program.users()
    end = dots[1].out
    cast = False
    perm = list(range(len(end.shape)))  # transposes on the way: a moved layout's pair cancels out
    while end is not output:
        readers = users.get(end, [])
        if len(readers) != 1:  # read twice (a gate o * sigmoid(o)): the tail starts here
            break
        node = readers[0]
        if node.prim == "div" and node.ins[0] is end and isinstance(node.ins[1], Var) and _row_sums(program, node.ins[1]):
            end = node.out
        elif node.prim == "convert_element_type" and not cast:
            cast, end = True, node.out
        elif node.prim == "transpose" and len(perm) == len(end.shape):
            perm = [perm[int(a)] for a in node.params["permutation"]]
            end = node.out
        elif node.prim in ("reshape", "squeeze") and perm == sorted(perm):  # grouped heads merged back, an
            end = node.out                                                    # axis of one mapped over dropped
            perm = list(range(len(end.shape)))
        else:
            break
    if end is output:
        return end, None
    if perm != sorted(perm):
        return "an elementwise tail after a transposed attention result"
    inside = {id(n) for n in program.ancestors(end)}
    tail = [n for n in program.nodes if id(n) not in inside]
    made = {end} | {o for n in tail for o in n.outs}
    for node in tail:
        if node.prim not in ELEMENTWISE and node.prim not in TAIL_PLUMBING:
            return f"{node.prim} after the attention (only elementwise ops may follow it)"
        if any(isinstance(op, Var) and op not in made for op in node.ins):
            return "an op after the attention reads something besides its result"
        if node.prim == "broadcast_in_dim" and any(isinstance(op, Var) and op.shape for op in node.ins):
            return "a broadcast of an array after the attention"
    if tuple(output.shape) != tuple(end.shape):
        return "an output shaped otherwise than the attention's result"
    return end, Program([end], [Node(n.primitive, list(n.ins), list(n.outs), dict(n.params), n.source, n.notes)
                                for n in tail], [output], program.out_tree)


def _row_sums(program: Program, divisor: Var) -> bool:
    """Whether ``divisor`` is computed from a sum over the scores' key axis (the softmax's denominator)."""
    return any(n.prim == "reduce_sum" for n in program.ancestors(divisor))
