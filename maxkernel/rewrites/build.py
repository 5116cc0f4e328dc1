"""Making new nodes inside a Program: shapes come from the primitive itself, never from guesswork."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax import lax
from jax._src import core

from maxkernel.analysis.program import Const, Node, Operand, Program, Var, _callee


def make(program: Program, primitive: Any, ins: list[Operand], **params: Any) -> tuple[Node, Var]:
    """A node binding ``primitive`` to ``ins`` (not yet placed in the program) and its output."""
    var_ins = [op for op in ins if isinstance(op, Var)]

    def bind(*vals: Any) -> Any:
        it = iter(vals)
        args = [next(it) if isinstance(op, Var) else _const_value(op) for op in ins]
        return primitive.bind(*args, **params)

    out = jax.eval_shape(bind, *[jax.ShapeDtypeStruct(v.shape, v.dtype) for v in var_ins])
    var = program.fresh(out.shape, out.dtype)
    return Node(primitive, list(ins), [var], dict(params)), var


def _const_value(c: Const) -> Any:
    return np.asarray(c.value, dtype=c.dtype)


def scalar(value: float, dtype: Any) -> Const:
    return Const(np.asarray(value, dtype=dtype), (), np.dtype(dtype), False)


class Splice:
    """Collects the nodes that replace one node, then puts them where it stood."""

    def __init__(self, program: Program) -> None:
        self.program = program
        self.nodes: list[Node] = []

    def add(self, primitive: Any, ins: list[Operand], **params: Any) -> Var:
        node, var = make(self.program, primitive, ins, **params)
        self.nodes.append(node)
        return var

    def reduce_sum(self, x: Operand, axes: tuple[int, ...]) -> Operand:
        if not axes:
            return x
        return self.add(lax.reduce_sum_p, [x], axes=tuple(sorted(axes)), out_sharding=None)

    def mul(self, x: Operand, c: Operand) -> Var:
        return self.add(lax.mul_p, [x, c])

    def reshape(self, x: Var, shape: tuple[int, ...]) -> Operand:
        if tuple(x.shape) == tuple(shape):
            return x
        return self.add(lax.reshape_p, [x], new_sizes=tuple(shape), dimensions=None, sharding=None)

    def commit(self, old: Node, result: Operand) -> None:
        """Replace ``old`` by the collected nodes; readers of its output read ``result``."""
        index = self.program.nodes.index(old)
        self.program.nodes[index:index + 1] = self.nodes
        _inherit_line(self.nodes, old, result)
        self.program.substitute(old.out, result)


def inline_traced(program: Program, fn: Any, operands: list[Var]) -> tuple[list[Node], list[Operand]]:
    """The equations of ``fn`` traced at the shapes of ``operands``, as new nodes of ``program`` (fresh
    names, not yet placed) reading ``operands``, and the operands standing for its outputs."""
    specs = [jax.ShapeDtypeStruct(op.shape, op.dtype) for op in operands]
    closed = jax.make_jaxpr(fn)(*specs)
    nodes: list[Node] = []

    def operand(env: dict[Any, Operand], atom: Any) -> Operand:
        if isinstance(atom, core.Literal):
            return Const(atom.val, tuple(np.shape(atom.val)), np.dtype(atom.aval.dtype),
                         bool(getattr(atom.aval, "weak_type", False)))
        return env[atom]

    def inline(jaxpr: Any, consts: Any, ins: list[Operand]) -> list[Operand]:
        env: dict[Any, Operand] = dict(zip(jaxpr.invars, ins))
        env.update((cv, Const(np.asarray(c), tuple(np.shape(c)), np.asarray(c).dtype, False))
                   for cv, c in zip(jaxpr.constvars, consts))
        for eqn in jaxpr.eqns:
            args = [operand(env, a) for a in eqn.invars]
            body = _callee(eqn)
            if body is not None:  # jnp helpers wrap themselves in jit: inline them like the tracer does
                env.update(zip(eqn.outvars, inline(body.jaxpr, body.consts, args)))
                continue
            outs = [program.fresh(tuple(v.aval.shape), v.aval.dtype) for v in eqn.outvars]
            nodes.append(Node(eqn.primitive, args, outs, dict(eqn.params)))
            env.update(zip(eqn.outvars, outs))
        return [operand(env, a) for a in jaxpr.outvars]

    results = inline(closed.jaxpr, closed.consts, list(operands))
    return nodes, results


def splice_traced(program: Program, old: Node, fn: Any, operands: list[Var] | None = None) -> list[Node]:
    """Replace ``old`` by the equations of ``fn`` traced at the shapes of ``operands`` (default: its own).

    The replacement is written as ordinary JAX (easier to get right than node-by-node construction);
    its equations are inlined with fresh names, so the emitter writes them out like any other node.
    Returns the inserted nodes.
    """
    nodes, (result,) = inline_traced(program, fn, list(old.ins) if operands is None else list(operands))
    if not isinstance(result, Var):
        raise ValueError("the replacement returns a constant")
    index = program.nodes.index(old)
    program.nodes[index:index + 1] = nodes
    _inherit_line(nodes, old, result)
    program.substitute(old.out, result)
    return nodes


def _inherit_line(nodes: list[Node], old: Node, result: Operand) -> None:
    """The node that now computes ``old``'s value stands for ``old``'s reference line (and its name)."""
    for node in nodes:
        if result in node.outs and node.source is None:
            node.source = old.source
