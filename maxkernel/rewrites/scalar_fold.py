"""Scalar chains folded: ``h * a + h`` → ``h * (a + 1)``, ``(h * a) * b`` → ``h * (a * b)``, ``h / 1`` → ``h``.

Every fold removes one elementwise pass over the tensor it touches.
"""

from __future__ import annotations


from maxkernel.analysis.program import Const, Node, Operand, Program, Var
from maxkernel.rewrites.base import Rewrite, single_use
from maxkernel.rewrites.build import Splice, scalar


def _scaled(node: Node | None, producers: dict[Var, Node]) -> tuple[Operand, float] | None:
    """(x, c) when ``node`` computes ``x * c`` or ``x / c`` for a scalar constant c."""
    if node is None or node.prim not in ("mul", "div"):
        return None
    a, b = node.ins
    if node.prim == "mul" and isinstance(a, Const) and not a.shape:
        a, b = b, a
    if isinstance(b, Const) and not b.shape and isinstance(a, Var) and b.static is None:  # a static is an argument
        c = float(b.scalar())  # type: ignore[arg-type]
        if node.prim == "div":
            if c == 0:
                return None
            c = 1.0 / c
        return a, c
    return None


def _fold_one(program: Program, node: Node, producers: dict[Var, Node]) -> bool:
    if not node.ins or not isinstance(node.out, Var) or getattr(node.out.dtype, "kind", None) != "f":
        return False
    sp = Splice(program)
    prim = node.prim
    if prim in ("mul", "div", "add", "sub"):
        a, b = node.ins
        const = b if isinstance(b, Const) and not b.shape and b.static is None else None
        if const is not None and isinstance(a, Var) and a.shape == node.out.shape:
            value = const.scalar()
            if (prim in ("mul", "div") and value == 1) or (prim in ("add", "sub") and value == 0):
                sp.commit(node, a)
                return True
        if prim == "mul" and isinstance(a, Const) and not a.shape and a.static is None and a.scalar() == 1 and isinstance(b, Var) and b.shape == node.out.shape:
            sp.commit(node, b)
            return True
    inner = _scaled(node, producers)
    if inner is not None:
        x, c = inner
        deeper = _scaled(producers.get(x), producers) if isinstance(x, Var) and single_use(program, x) else None
        if deeper is not None:
            y, c2 = deeper
            sp.commit(node, sp.mul(y, scalar(c * c2, node.out.dtype)))
            return True
    if prim == "add":
        a, b = node.ins
        terms = []
        for op in (a, b):
            s = _scaled(producers.get(op), producers) if isinstance(op, Var) else None
            terms.append(s if s is not None and single_use(program, op) else (op, 1.0))
        (x1, c1), (x2, c2) = terms
        if x1 is x2 and isinstance(x1, Var) and x1.shape == node.out.shape and (c1, c2) != (1.0, 1.0) or (a is b and isinstance(a, Var)):
            sp.commit(node, sp.mul(x1, scalar(c1 + c2, node.out.dtype)))
            return True
    if prim == "neg":
        src = producers.get(node.ins[0]) if isinstance(node.ins[0], Var) else None
        if src is not None and src.prim == "neg":
            sp.commit(node, src.ins[0])
            return True
    return False


def fold_scalars(program: Program) -> int:
    count = 0
    changed = True
    while changed and count < 100:
        changed = False
        producers = program.producers()
        for node in list(program.nodes):
            if _fold_one(program, node, producers):
                program.dce()
                count += 1
                changed = True
                break
    return count


SCALAR_CHAINS = Rewrite("scalar_chains", "chains of scalar scaling and residual adds folded into one multiply", fold_scalars)
