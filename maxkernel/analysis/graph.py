"""The op graph of a reference: which kinds of work it does and how they chain.

Matmuls carry their prologue (the ops between the inputs and the matmul operands) and epilogue (the
elementwise chain that consumes the product); reductions, normalizations, softmax and logsumexp are
recognised from their primitive sequences, so planners and templates can reason about the work rather
than the code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from maxkernel.analysis.models import OpKind, OpNode

if TYPE_CHECKING:
    from maxkernel.analysis.program import Node, Program

ELEMENTWISE = {
    "add", "sub", "mul", "div", "max", "min", "pow", "integer_pow", "neg", "exp", "exp2", "log", "log1p", "tanh",
    "logistic", "rsqrt", "sqrt", "abs", "sign", "square", "erf", "erfc", "is_finite", "select_n", "lt", "le", "gt",
    "ge", "eq", "ne", "and", "or", "not", "clamp", "sin", "cos", "convert_element_type", "stop_gradient", "copy",
    "expm1", "rem", "floor", "ceil", "round",
}
PLUMBING = {"broadcast_in_dim", "reshape", "squeeze", "expand_dims", "transpose", "convert_element_type",
            "copy", "stop_gradient", "iota"}
REDUCE = {"reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "argmax", "argmin", "reduce_and", "reduce_or"}
GATHER = {"gather", "dynamic_slice", "dynamic_update_slice", "scatter", "scatter-add", "scatter_add", "take"}
SCAN = {"scan", "while", "cumsum", "cumprod", "cummax", "cumlogsumexp"}


def _is_var(op: object) -> bool:
    from maxkernel.analysis.program import Var

    return isinstance(op, Var)


def _kind(node: Node) -> OpKind:
    p = node.prim
    if p in ("dot_general", "ragged_dot_general"):
        return "matmul"
    if p == "conv_general_dilated":
        return "conv"
    if p in REDUCE:
        return "reduction"
    if p in GATHER:
        return "gather"
    if p in SCAN:
        return "scan"
    if p in ELEMENTWISE or p in PLUMBING:
        return "elementwise"
    return "other"


def _prologue(program: Program, node: Node) -> list[str]:
    producers = program.producers()
    chain: list[str] = []
    for op in node.ins:
        p = producers.get(op) if _is_var(op) else None
        while p is not None and (p.prim in ELEMENTWISE or p.prim in PLUMBING) and len(chain) < 16:
            chain.append(p.prim)
            vars_in = [o for o in p.ins if _is_var(o)]
            p = producers.get(vars_in[0]) if len(vars_in) == 1 else None
    return list(reversed(chain))


def _epilogue(program: Program, node: Node) -> list[str]:
    users = program.users()
    chain: list[str] = []
    current = node.out
    while len(chain) < 64:
        readers = users.get(current, [])
        if len(readers) != 1 or readers[0].prim not in ELEMENTWISE | PLUMBING | REDUCE:
            break
        nxt = readers[0]
        chain.append(nxt.prim)
        if nxt.prim in REDUCE:
            break
        current = nxt.out
    return chain


def _contains(seq: list[str], pattern: list[str]) -> bool:
    """``pattern`` occurs in ``seq`` as a subsequence (other ops may sit between)."""
    it = iter(seq)
    return all(any(x == p for x in it) for p in pattern)


def detect_patterns(program: Program) -> list[str]:
    """Names of the compound computations present (softmax, logsumexp, rms/layer norm, attention...)."""
    prims = [p for p in program.primitives() if p not in PLUMBING]
    found: list[str] = []
    if _contains(prims, ["reduce_max", "sub", "exp", "reduce_sum", "div"]):
        found.append("softmax")
    if _contains(prims, ["reduce_max", "exp", "reduce_sum", "log"]):
        found.append("logsumexp")
    if _contains(prims, ["reduce_sum", "rsqrt"]):
        found.append("layernorm" if _contains(prims, ["reduce_sum", "sub", "square", "reduce_sum", "rsqrt"]) else "rmsnorm")
    dots = prims.count("dot_general")
    if dots >= 2 and _contains(prims, ["dot_general", "reduce_max", "exp", "reduce_sum", "dot_general"]):
        found.append("attention")
    if dots >= 1:
        found.append("matmul")
        first = next(n for n in program.nodes if n.prim == "dot_general")
        epi = _epilogue(program, first)
        if epi and epi[-1] in REDUCE:
            found.append("matmul_then_reduction")
        elif any(p not in PLUMBING for p in epi):
            found.append("matmul_epilogue")
    if "conv_general_dilated" in prims:
        found.append("conv")
    if any(p in SCAN for p in prims):
        found.append("scan")
    if any(p in GATHER for p in prims):
        found.append("gather")
    if prims and all(p in ELEMENTWISE for p in prims):
        found.append("elementwise")
    return found


def op_graph(program: Program) -> list[OpNode]:
    """One OpNode per significant op (matmuls, convs, reductions...), elementwise runs merged."""
    nodes: list[OpNode] = []
    run: list[Node] = []

    def flush() -> None:
        if run:
            nodes.append(OpNode(kind="elementwise", primitives=[n.prim for n in run],
                                shapes=[list(run[-1].out.shape)]))
            run.clear()

    for node in program.nodes:
        kind = _kind(node)
        if kind == "elementwise":
            if node.prim not in PLUMBING:
                run.append(node)
            continue
        flush()
        entry = OpNode(kind=kind, primitives=[node.prim], shapes=[list(o.shape) for o in node.outs])
        if kind == "matmul":
            entry.prologue = _prologue(program, node)
            entry.epilogue = _epilogue(program, node)
            entry.detail = f"operands {[list(o.shape) for o in node.ins]}"
        elif kind == "reduction":
            axes = node.params.get("axes", ())
            entry.detail = f"axes {tuple(axes)} of {list(node.ins[0].shape)}"
        nodes.append(entry)
    flush()
    return nodes
