"""Reductions over size-1 axes are reshapes: max, min, sum or product of one element is that element."""

from __future__ import annotations

from maxkernel.analysis.program import Program, Var
from maxkernel.rewrites.base import Rewrite
from maxkernel.rewrites.build import Splice

REDUCTIONS = ("reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or")


def drop_size_one_reductions(program: Program) -> int:
    count = 0
    for node in list(program.nodes):
        x = node.ins[0] if node.ins else None
        if node.prim not in REDUCTIONS or not isinstance(x, Var):
            continue
        if all(x.shape[a] == 1 for a in node.params["axes"]):
            sp = Splice(program)
            sp.commit(node, sp.reshape(x, node.out.shape))
            count += 1
    return count


SIZE_ONE_REDUCTIONS = Rewrite("size_one_reductions", "reductions over size-1 axes become reshapes", drop_size_one_reductions)
