"""Scalars the reference computes from constants alone (``x / jnp.sqrt(jnp.float32(d))``) folded into
literals before the program is cut, so a region reads ``x / 8.0`` as a template's matcher expects of a
scale, whatever way the layer spelt it."""

from __future__ import annotations

import numpy as np

from maxkernel.analysis.program import Const, Node, Program, Var
from maxkernel.rewrites.numeric import evaluate_nodes


def _foldable(node: Node) -> bool:
    return (bool(node.ins) and not node.primitive.multiple_results and len(node.outs) == 1
            and all(isinstance(op, Const) and not op.shape for op in node.ins) and not node.outs[0].shape)


def fold_constant_scalars(program: Program) -> int:
    """Replace every scalar node whose operands are scalar literals by its value; returns how many."""
    folded = 0
    for node in list(program.nodes):
        if not _foldable(node):
            continue
        out: Var = node.outs[0]
        value = evaluate_nodes([node], {})[out]
        program.substitute(out, Const(np.asarray(value, dtype=out.dtype), (), np.dtype(out.dtype), False))
        folded += 1
    if folded:
        program.dce()
    return folded
