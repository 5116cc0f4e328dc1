"""Sum after matmul → matmul with pre-summed weights.

``sum_j (x @ W)[i, j] == x @ (sum_j W[:, j])``: a reduction over a matmul's free output axis moves into
the weight, which turns an [M, N, K] matmul into an [M, K] matrix-vector product. To reach the matmul the
reduction is pushed through the linear ops between them: scalar scaling, negation, sums of terms,
broadcasts (a broadcast axis contributes its length as a factor) and transposes.
"""

from __future__ import annotations

import numpy as np

from maxkernel.analysis.program import Const, Node, Program, Var
from maxkernel.rewrites.base import Rewrite, single_use
from maxkernel.rewrites.build import Splice, scalar


def _is_scalar(op: object) -> bool:
    return isinstance(op, Const) and not op.shape


def _push(program: Program, red: Node, src: Node) -> bool:
    axes = tuple(int(a) for a in red.params["axes"])
    sp = Splice(program)
    prim = src.prim
    if prim in ("mul", "div"):
        a, b = src.ins
        if prim == "mul" and _is_scalar(a):
            a, b = b, a
        if not _is_scalar(b) or not isinstance(a, Var):
            return False
        result = sp.add(src.primitive, [sp.reduce_sum(a, axes), b])
    elif prim == "neg":
        result = sp.add(src.primitive, [sp.reduce_sum(src.ins[0], axes)])
    elif prim in ("add", "sub"):
        terms = []
        for op in src.ins:
            if isinstance(op, Var) and len(op.shape) == len(src.out.shape):
                # size-1 axes broadcast implicitly: each contributes its output length as a factor
                factor = int(np.prod([src.out.shape[a] for a in axes if op.shape[a] == 1]))
                term = sp.reduce_sum(op, axes)
                terms.append(sp.mul(term, scalar(float(factor), src.out.dtype)) if factor != 1 else term)
            elif _is_scalar(op):
                count = int(np.prod([src.out.shape[a] for a in axes]))
                terms.append(scalar(float(op.scalar()) * count, src.out.dtype))  # type: ignore[arg-type]
            else:
                return False
        result = sp.add(src.primitive, terms)
    elif prim == "broadcast_in_dim":
        result = _through_broadcast(sp, src, axes)
    elif prim == "transpose":
        perm = tuple(int(p) for p in src.params["permutation"])
        inner = sp.reduce_sum(src.ins[0], tuple(perm[a] for a in axes))
        kept = [perm[d] for d in range(len(perm)) if d not in axes]
        order = sorted(kept)
        new_perm = tuple(order.index(p) for p in kept)
        result = inner if new_perm == tuple(range(len(new_perm))) else sp.add(src.primitive, [inner], permutation=new_perm)
    elif prim == "dot_general":
        result = _through_dot(sp, src, axes)
    else:
        return False
    if result is None:
        return False
    sp.commit(red, result)
    return True


def _through_broadcast(sp: Splice, src: Node, axes: tuple[int, ...]) -> Var | None:
    (u,) = src.ins
    if not isinstance(u, Var):
        return None
    shape = tuple(src.params["shape"])
    bdims = tuple(int(d) for d in src.params["broadcast_dimensions"])
    factor = 1
    u_axes = []
    for a in axes:
        if a in bdims:
            ud = bdims.index(a)
            u_axes.append(ud)
            if u.shape[ud] == 1:
                factor *= shape[a]
        else:
            factor *= shape[a]
    reduced = sp.reduce_sum(u, tuple(u_axes))
    kept_out = [d for d in range(len(shape)) if d not in axes]
    out_shape = tuple(shape[d] for d in kept_out)
    new_bdims = tuple(kept_out.index(bdims[ud]) for ud in range(len(u.shape)) if ud not in u_axes)
    result = sp.add(src.primitive, [reduced], shape=out_shape, broadcast_dimensions=new_bdims, sharding=None)
    return sp.mul(result, scalar(float(factor), src.out.dtype)) if factor != 1 else result


def _through_dot(sp: Splice, src: Node, axes: tuple[int, ...]) -> Var | None:
    lhs, rhs = src.ins
    (lc, rc), (lb, rb) = src.params["dimension_numbers"]
    if not isinstance(lhs, Var) or not isinstance(rhs, Var):
        return None
    nb = len(lb)
    lfree = [d for d in range(len(lhs.shape)) if d not in lc and d not in lb]
    rfree = [d for d in range(len(rhs.shape)) if d not in rc and d not in rb]
    lpos = {nb + i: d for i, d in enumerate(lfree)}
    rpos = {nb + len(lfree) + i: d for i, d in enumerate(rfree)}
    if all(a in rpos for a in axes):
        side, dims = "rhs", [rpos[a] for a in axes]
    elif all(a in lpos for a in axes):
        side, dims = "lhs", [lpos[a] for a in axes]
    else:
        return None

    def shift(idx: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(i - sum(1 for d in dims if d < i) for i in idx)

    if side == "rhs":
        new_rhs = sp.reduce_sum(rhs, tuple(dims))
        dn = ((tuple(lc), shift(tuple(rc))), (tuple(lb), shift(tuple(rb))))
        ins = [lhs, new_rhs]
    else:
        new_lhs = sp.reduce_sum(lhs, tuple(dims))
        dn = ((shift(tuple(lc)), tuple(rc)), (shift(tuple(lb)), tuple(rb)))
        ins = [new_lhs, rhs]
    params = dict(src.params)
    params["dimension_numbers"] = dn
    if all(np.dtype(op.dtype) == np.float32 for op in ins):
        # The pre-summed operand is rounded once where the original product rounded every term (whose
        # errors mostly cancel in the sum): at one bfloat16 pass the rewrite would be less exact than the
        # reference. The product is now a matrix-vector one, so exact float32 passes cost little.
        from jax import lax

        params["precision"] = (lax.Precision.HIGHEST, lax.Precision.HIGHEST)
    return sp.add(src.primitive, ins, **params)


def push_sums(program: Program) -> int:
    """Push every reduce_sum toward the inputs while it can; count the steps taken."""
    steps = 0
    changed = True
    while changed and steps < 200:
        changed = False
        producers = program.producers()
        for node in list(program.nodes):
            if node.prim != "reduce_sum" or not isinstance(node.ins[0], Var):
                continue
            src = producers.get(node.ins[0])
            if src is None or not single_use(program, node.ins[0]):
                continue
            if _push(program, node, src):
                program.dce()
                steps += 1
                changed = True
                break
    return steps if _reaches_dot(program) else 0


def _reaches_dot(program: Program) -> bool:
    """The push paid off only if some matmul now contracts against a pre-summed operand."""
    producers = program.producers()
    for node in program.nodes:
        if node.prim == "dot_general":
            for op in node.ins:
                p = producers.get(op) if isinstance(op, Var) else None
                while p is not None and p.prim in ("transpose", "reshape", "mul", "neg"):
                    p = producers.get(p.ins[0]) if isinstance(p.ins[0], Var) else None
                if p is not None and p.prim == "reduce_sum":
                    return True
    return False


SUM_AFTER_MATMUL = Rewrite(
    "sum_after_matmul",
    "a sum over a matmul's output axis becomes a matmul with pre-summed weights",
    push_sums,
)
