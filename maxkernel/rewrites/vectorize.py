"""Loops whose iterations are independent (``lax.map``) run as one batched computation.

A scan with no carry computes each iteration from its own slice of the inputs; on a CPU it runs the
iterations one after another, each too small to keep both cores and the vector units busy. ``vmap`` of
the same body computes all iterations at once with batched matmuls and gathers. The body is the
reference's own (evaluated from its jaxpr), so only the batching is new, and once flat, the loop's
matmuls are open to the other rewrites.
"""

from __future__ import annotations

from typing import Any

import jax
from jax._src import core

from maxkernel.analysis.program import Node, Program, Var
from maxkernel.rewrites.base import Rewrite
from maxkernel.rewrites.build import splice_traced


def _batched(node: Node) -> Any:
    body = node.params["jaxpr"]
    consts = int(node.params["num_consts"])

    def fn(*operands: Any) -> Any:
        fixed, sliced = operands[:consts], operands[consts:]
        (out,) = jax.vmap(lambda *x: core.eval_jaxpr(body.jaxpr, body.consts, *fixed, *x))(*sliced)
        return out

    return fn


def vectorize_maps(program: Program) -> int:
    count = 0
    for node in list(program.nodes):
        if (node.prim == "scan" and int(node.params["num_carry"]) == 0 and not node.params["reverse"]
                and len(node.outs) == 1 and all(isinstance(op, Var) for op in node.ins)):
            splice_traced(program, node, _batched(node))
            count += 1
    return count


VECTORIZE_MAPS = Rewrite("vectorize_maps", "a loop of independent iterations (lax.map) run as one batched computation",
                         vectorize_maps)
