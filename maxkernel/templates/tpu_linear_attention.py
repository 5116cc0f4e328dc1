"""TPU linear attention: ``Q K^T`` scores times a factor of positions and per-position values, optionally
divided by a row sum of what the scores become, applied to ``V`` — RetNet's retention and Mamba-2's SSD in
their quadratic ("dual") form, whatever the reference calls its arguments.

Matched by data flow on the jaxpr: two products, the first reading one input per operand (q and k), the
second one input (v) on its right; between them only elementwise work on score tiles. Every operand of that
work that does not vary along both the query and the key axis — a decay rate per head, a cumulative log
gate per position, the positions themselves — is computed by XLA as the reference computes it and read by
the kernel as a row ``[block_q, 1]``, a column ``[1, block_k]`` or one value per head. One reduction is
allowed: a sum over the keys of what the scores become, which the reference then turns into a per-row
divisor (a RetNet or SSD normalizer). Dividing a row before the value product equals dividing the product
after it, so the kernel accumulates the row sum beside the product over the key blocks and divides once.

What an expert writes, and this emits:
- a grid (batch, head, step) whose steps are the (query block, key block) pairs the factor leaves visible,
  row by row, prefetched as scalars: where the factor is zero above the diagonal whatever the inputs (an
  abstract evaluation at the cpu size proves it), a block above the diagonal costs neither a DMA nor a
  step;
- the reference's own elementwise ops on each score tile, iotas made from the block's offsets: no [S, S]
  factor ever reaches HBM;
- both products on the MXU into an f32 accumulator, the row sum in an f32 column beside it, the divisor
  and the output written once after the row's last key block.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from maxkernel.analysis.program import Const, Node, Program, Var, arg_names, static_args, trace_program
from maxkernel.analysis.statics import static_text
from maxkernel.rewrites.emit import EmitError, dtype_expr, emit_function, scalar_text
from maxkernel.rewrites.numeric import TooLargeToEvaluate, evaluate_nodes
from maxkernel.templates.base import FIT_SOURCE, TPU_VMEM_BUDGET, TemplateSpace, block_pair_space, tpu_target
from maxkernel.templates.tpu_gemm import HEADER, W_KN_DIMENSIONS, W_NK_DIMENSIONS, _mxu_source, _passes, chosen_passes
from maxkernel.templates.tpu_mlp import _precision

if TYPE_CHECKING:
    from jaxbench.task import Task
    from maxkernel.analysis import TaskAnalysis

TPU_BLOCKS = (128, 256, 512, 1024)
SCORE_DIMENSIONS = (((3,), (3,)), ((0, 1), (0, 1)))  # [b, h, q, d] x [b, h, k, d] -> [b, h, q, k]
VALUE_DIMENSIONS = (((3,), (2,)), ((0, 1), (0, 1)))  # [b, h, q, k] x [b, h, k, d] -> [b, h, q, d]
INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/", "ge": ">=", "gt": ">", "le": "<=", "lt": "<", "eq": "==",
         "ne": "!=", "and": "&", "or": "|"}
CALLS = {"max": "jnp.maximum", "min": "jnp.minimum", "pow": "jnp.power", "exp": "jnp.exp", "exp2": "jnp.exp2",
         "log": "jnp.log", "log1p": "jnp.log1p", "expm1": "jnp.expm1", "abs": "jnp.abs", "sign": "jnp.sign",
         "tanh": "jnp.tanh", "logistic": "jax.nn.sigmoid", "sqrt": "jnp.sqrt", "rsqrt": "jax.lax.rsqrt",
         "not": "jnp.logical_not", "square": "jnp.square"}
SHAPING = frozenset({"broadcast_in_dim", "reshape", "squeeze", "expand_dims"})
TILE_PRIMS = frozenset(INFIX) | frozenset(CALLS) | SHAPING | {"neg", "integer_pow", "select_n", "convert_element_type",
                                                               "iota"}
# exp of a value at or below this is exactly 0 in float32 (the smallest subnormal is about exp(-103.3)).
EXP_ZERO_BELOW = -1e4


@dataclass
class Leaf:
    """A value the score tiles read that does not vary along both sequence axes: computed by XLA, read per
    block."""

    var: Var
    aligned: tuple[int, int, int, int]  # its shape right-aligned to [batch, heads, q, k] (1 where it is constant)
    reads_inputs: bool
    position: int | None = None  # 0 or 1: the positions along the query or key axis (an iota), made in the kernel

    @property
    def rows(self) -> bool:
        return self.aligned[2] > 1

    @property
    def cols(self) -> bool:
        return self.aligned[3] > 1


@dataclass
class LinearAttention:
    q: Var
    k: Var
    v: Var
    q_factor: float
    scores: Var  # the first product's result
    tile_nodes: list[Node]  # in program order: what each score tile goes through
    leaves: list[Leaf]
    mixed: Var  # the tile that multiplies v (before the normalizer, when there is one)
    mixed_dtype: Any  # the dtype the reference multiplies v in
    summed: Var | None = None  # the tile whose row sum the normalizer reads
    row_nodes: list[Node] = field(default_factory=list)  # from the row sum to the divisor
    row_sum: Var | None = None
    divisor: Var | None = None
    product: Var | None = None  # the value product's result
    tail: list[Node] = field(default_factory=list)  # what follows it, on rows of the output tile
    divides: bool = True  # the divisor divides the rows (else multiplies them)
    causal: bool = False
    out_dtype: Any = None
    in_dtype: Any = None
    precision: str = "DEFAULT"
    names: tuple[str, str, str] = ("q", "k", "v")
    program: Program | None = None  # what was matched (the renderer names its values)
    layout: Any = None  # the moves from the reference's arguments to [batch, heads, seq, head_dim], if any
    folds: dict[int, int] = field(default_factory=dict)  # select node -> the case it takes below the diagonal


def _is_tile(var: Var, sq: int, sk: int) -> bool:
    return len(var.shape) >= 2 and tuple(var.shape[-2:]) == (sq, sk)


def _through_moves(program: Program, var: Var, moved: bool) -> Var:
    """``var`` traced back through casts (and, for a moved program, transposes) to what they read."""
    producers = program.producers()
    passes = ("convert_element_type", "transpose") if moved else ("convert_element_type",)
    while var in producers and producers[var].prim in passes:
        var = producers[var].ins[0]  # type: ignore[assignment]
    return var


def _moved_tail(program: Program, product: Var, at: int) -> list[Node] | str:
    """For a moved program: the casts and transposes that take the value product (``[b, h, i, p]``, or
    ``[b, h, p, i]`` with the scores on its right) to the output in ``[b, h, i, p]``; nothing else follows."""
    labels = list("bhip") if at == 0 else list("bhpi")
    users = program.users()
    tail, var = [], product
    while var is not program.outputs[0]:
        readers = users.get(var, [])
        if len(readers) != 1 or readers[0].prim not in ("transpose", "convert_element_type"):
            return "something other than casts and transposes after the value product (with the arguments moved)"
        node = readers[0]
        if node.prim == "transpose":
            labels = [labels[a] for a in node.params["permutation"]]
        tail.append(node)
        var = node.out
    if labels != list("bhip"):
        return "the output is not the value product's rows"
    return []  # the kernel writes the product's rows in the output's dtype


def _aligned(var: Var, score: tuple[int, ...]) -> tuple[int, int, int, int] | None:
    """``var``'s shape right-aligned to the scores' ``[b, h, q, k]``, or None when an axis matches neither
    the scores' extent nor 1."""
    if len(var.shape) > 4:
        return None
    shape = (1,) * (4 - len(var.shape)) + tuple(int(d) for d in var.shape)
    if any(d not in (1, s) for d, s in zip(shape, score)):
        return None
    return shape  # type: ignore[return-value]


def _tile_walk(program: Program, starts: list[Var], score: Var, stop: set[Var]) -> tuple[list[Node], list[Var]] | str:
    """The nodes that make ``starts`` from the score tile by elementwise work on tiles, and the vars they read
    that are not tiles of that work (the leaves); vars in ``stop`` are read as leaves."""
    producers = program.producers()
    sq, sk = score.shape[-2:]
    nodes: set[int] = set()
    leaves: list[Var] = []
    seen: set[int] = set()
    stack = list(starts)
    while stack:
        var = stack.pop()
        if id(var) in seen or var is score:
            continue
        seen.add(id(var))
        node = producers.get(var)
        tile = _is_tile(var, sq, sk) or _constant_scalar(program, var)
        if var in stop or node is None or not tile or node.prim not in TILE_PRIMS:
            leaves.append(var)
            continue
        if node.prim == "iota" and int(node.params["dimension"]) < len(var.shape) - 2:
            return "an iota along an axis other than the two sequence axes"
        if node.prim == "select_n" and (len(node.ins) != 3 or np.dtype(node.ins[0].dtype) != np.dtype(bool)):
            return "a select on an integer case index"
        nodes.add(id(node))
        for op in node.ins:
            if isinstance(op, Var):
                stack.append(op)
            elif op.size != 1:
                return "an array constant in the score work"
    return [n for n in program.nodes if id(n) in nodes], leaves


def _constant_scalar(program: Program, var: Var) -> bool:
    """One value computed from scalar literals alone (a cast literal, its broadcast): written inline in the
    kernel."""
    if program.reads(var):
        return False
    ancestors = program.ancestors(var)
    return all(n.prim in TILE_PRIMS and n.prim != "iota" and all(not isinstance(op, Const) or op.size == 1 for op in n.ins)
               for n in ancestors) and (bool(ancestors) or var.size == 1)


def _reads_only(program: Program, node: Node, inside: set[int], literal: set[int]) -> bool:
    """Whether ``node`` reads only vars in ``inside`` (by id) and scalar literals; the nodes that make the
    literals are added to ``literal``."""
    for op in node.ins:
        if isinstance(op, Var) and id(op) not in inside:
            if not _constant_scalar(program, op):
                return False
            literal.update(id(n) for n in program.ancestors(op))
        elif isinstance(op, Const) and op.size != 1:
            return False
    return True


def _descendants(program: Program, var: Var) -> set[int]:
    found = {id(var)}
    for node in program.nodes:
        if any(isinstance(op, Var) and id(op) in found for op in node.ins):
            found.update(id(o) for o in node.outs)
    return found


def match(program: Program, moved: bool = False) -> LinearAttention | str:
    """The linear attention ``program`` computes, or why it is not one. ``moved``: the program's q, k and v
    were moved to ``[batch, heads, seq, head_dim]`` (``attention_layout``, which read the products' axes),
    so transposes lie between them and the products, and between the value product and the output."""
    from maxkernel.rewrites.blocked_attention import _scalar_factor

    dots = [n for n in program.nodes if n.prim == "dot_general"]
    if len(dots) != 2:
        return "not two matmuls (scores, then scores times values)"
    first, second = dots
    side = [isinstance(op, Var) and id(op) in _descendants(program, first.out) for op in second.ins]
    if side != [True, False] and not (moved and side == [False, True]):
        return "the value product does not take the scores on its left"
    at = side.index(True)
    reads = [program.reads(op) if isinstance(op, Var) else set() for op in (*first.ins, second.ins[1 - at])]
    if any(len(r) != 1 for r in reads):
        return "the products do not read one input per operand (q and k, then v)"
    by_name = {v.name: v for v in program.inputs}
    q, k, v = (by_name[next(iter(r))] for r in reads)
    if len({q.name, k.name, v.name}) != 3 or any(len(t.shape) != 4 for t in (q, k, v)):
        return "q, k and v are not three inputs of rank 4"
    batch, heads, sq, d = q.shape
    if k.shape != (batch, heads, sq, d) or v.shape[:3] != (batch, heads, sq):
        return "q, k and v are not [batch, heads, seq, head_dim] of one sequence"
    if moved:
        written = (batch, heads, sq, v.shape[3]) if at == 0 else (batch, heads, v.shape[3], sq)
        if tuple(first.out.shape) != (batch, heads, sq, sq) or tuple(second.out.shape) != written:
            return "the products are not q k^T and scores times v per batch and head"
    elif (tuple(first.params["dimension_numbers"]) != SCORE_DIMENSIONS
            or tuple(second.params["dimension_numbers"]) != VALUE_DIMENSIONS):
        return "the products are not q k^T and scores times v per batch and head"
    if _through_moves(program, second.ins[1 - at], moved) is not v:  # type: ignore[arg-type]
        return "the value product reads more than v"
    try:
        q_factor = (_scalar_factor(program, first.ins[0], q, moved)  # type: ignore[arg-type]
                    * _scalar_factor(program, first.ins[1], k, moved))  # type: ignore[arg-type]
    except EmitError as exc:
        return str(exc)
    tail = _moved_tail(program, second.out, at) if moved else _tail(program, second.out)
    if isinstance(tail, str):
        return tail
    score = first.out
    if sq < 8 or sq % 8:
        return "a sequence too short for score tiles"
    mixed = second.ins[at]
    assert isinstance(mixed, Var)
    found = LinearAttention(q, k, v, q_factor, score, [], [], mixed, mixed.dtype, out_dtype=program.outputs[0].dtype,
                            in_dtype=np.dtype(q.dtype), names=(q.name, k.name, v.name), product=second.out, tail=tail)
    precisions = {_precision(first), _precision(second)}
    if len(precisions) != 1:
        return "the two products at different precisions"
    found.precision = precisions.pop()
    from_score = _descendants(program, score)
    walked = _tile_walk(program, [mixed], score, set())
    if isinstance(walked, str):
        return walked
    normalizers = [leaf for leaf in walked[1] if id(leaf) in from_score]
    if normalizers:
        norm = _normalizer(program, found, normalizers, from_score)
        if norm is not None:
            return norm
        walked = _tile_walk(program, [found.mixed] + ([found.summed] if found.summed is not None else []), score,
                            {found.divisor} if found.divisor is not None else set())  # type: ignore[arg-type]
        if isinstance(walked, str):
            return walked
    nodes, leaf_vars = walked
    if any(id(leaf) in from_score for leaf in leaf_vars):
        return "the scores reach the value product other than through tile work and one row sum"
    if id(found.mixed) not in from_score:
        return "the value product does not read the scores"
    found.tile_nodes = nodes
    for var in leaf_vars:
        aligned = _aligned(var, score.shape)
        if aligned is None:
            return f"a score term shaped {var.shape}, not a broadcast of [batch, heads, seq, seq]"
        found.leaves.append(Leaf(var, aligned, bool(program.reads(var)), _position_axis(program, var, aligned)))
    return found


def _position_axis(program: Program, var: Var, aligned: tuple[int, int, int, int]) -> int | None:
    """0 or 1 where ``var`` is the positions ``0..seq-1`` along the query or key axis (an iota, its casts and
    broadcasts): the kernel makes them from the block's offsets instead of reading them."""
    if aligned[:2] != (1, 1) or (aligned[2] > 1) == (aligned[3] > 1):
        return None
    producers = program.producers()
    node = producers.get(var)
    while node is not None and (node.prim in SHAPING or node.prim == "convert_element_type"):
        node = producers.get(node.ins[0]) if isinstance(node.ins[0], Var) else None
    if node is None or node.prim != "iota" or len(node.out.shape) != 1:
        return None
    return 0 if aligned[2] > 1 else 1


ROW_REDUCTIONS = {"reduce_sum": "jnp.sum", "reduce_max": "jnp.max", "reduce_min": "jnp.min"}


def _tail(program: Program, product: Var) -> list[Node] | str:
    """The nodes from the value product to the output: elementwise work and reductions over the head
    dimension (a norm per row), reading nothing else but literals."""
    if len(program.outputs) != 1 or not isinstance(program.outputs[0], Var):
        return "not one output"
    after = _descendants(program, product)
    if id(program.outputs[0]) not in after:
        return "the output is not computed from the value product"
    literal: set[int] = set()
    tail = [n for n in program.nodes if id(n.out) in after and n.outs[0] is not product]
    for node in tail:
        rank = len(node.ins[0].shape) if node.ins else 0
        if node.prim in ROW_REDUCTIONS:
            if tuple(node.params["axes"]) != (rank - 1,):
                return f"a {node.prim} after the value product over another axis than the head dimension"
        elif node.prim not in TILE_PRIMS or node.prim == "iota":
            return f"{node.prim} after the value product"
        if len(node.out.shape) < 3 or tuple(node.out.shape[:3]) != tuple(product.shape[:3]):
            return "what follows the value product mixes rows of the output"
        if not _reads_only(program, node, after, literal):
            return "what follows the value product reads more than it and scalar literals"
    if tuple(program.outputs[0].shape) != tuple(product.shape):
        return "the output is not shaped like the value product"
    return [n for n in program.nodes if id(n) in literal or n in tail]


def _normalizer(program: Program, found: LinearAttention, normalizers: list[Var], from_score: set[int]) -> str | None:
    """Fills ``found``'s row sum, divisor and the tile it divides; the reason when the scores reach the value
    product through anything else."""
    producers = program.producers()
    sq, sk = found.scores.shape[-2:]
    if len(normalizers) != 1:
        return "more than one value of the scores' rows feeds the value product"
    divisor = normalizers[0]
    if len(divisor.shape) < 2 or divisor.shape[-2:] != (sq, 1):
        return "what the scores' row sum becomes is not one value per row"
    rows = [n for n in program.ancestors(divisor) if id(n.out) in from_score]
    sums = [n for n in rows if n.prim == "reduce_sum"]
    if len(sums) != 1 or tuple(sums[0].params["axes"]) != (len(sums[0].ins[0].shape) - 1,):
        return "not one sum over the keys before the divisor"
    summed = sums[0].ins[0]
    if not isinstance(summed, Var) or not _is_tile(summed, sq, sk):
        return "the row sum is not of a score tile"
    after_sum = _descendants(program, sums[0].out)
    row_nodes = [n for n in rows if n is not sums[0] and id(n.out) in after_sum]
    literal: set[int] = set()
    for node in row_nodes:
        if node.prim not in TILE_PRIMS or node.prim == "iota":
            return f"{node.prim} between the row sum and the divisor"
        if not _reads_only(program, node, after_sum, literal):
            return "the divisor reads more than the row sum and scalar literals"
    row_nodes = [n for n in program.nodes if id(n) in literal or n in row_nodes]
    # The divisor applies to the rows once, right before the casts to the value product.
    apply = producers.get(_through_moves(program, found.mixed, False))
    if apply is None or apply.prim not in ("div", "mul") or divisor not in apply.ins:
        return "the divisor is not applied to the scores right before the value product"
    if apply.prim == "div" and apply.ins[1] is not divisor:
        return "the scores divide the divisor"
    tile = next(op for op in apply.ins if op is not divisor)
    if not isinstance(tile, Var) or id(tile) in _descendants(program, divisor):
        return "the divided tile depends on its own divisor"
    found.mixed, found.summed, found.divisor, found.divides = tile, summed, divisor, apply.prim == "div"
    found.row_sum, found.row_nodes = sums[0].out, row_nodes
    return None


def hidden_keys(program: Program, a: LinearAttention) -> np.ndarray | str:
    """[q, k]: True where the tile multiplying v (and the one summed) is zero for every input, by an abstract
    evaluation at this program's size: values of no input are computed, the rest known only where a zero
    factor, a select of a constant or exp of a huge negative value makes them zero. A string says why the
    terms could not be evaluated here (too large): then every block pair runs. Also records in ``a.folds`` the
    selects whose predicate (of positions alone) takes one case on and below the diagonal everywhere: a block
    wholly below it computes that case alone."""
    zero: dict[int, np.ndarray] = {}
    tiny: dict[int, np.ndarray] = {}
    value: dict[int, np.ndarray] = {}
    try:
        for leaf in a.leaves:
            if not leaf.reads_inputs:
                value[id(leaf.var)] = evaluate_nodes(program.ancestors(leaf.var), {})[leaf.var]
        for node in a.tile_nodes:
            ins = node.ins
            if all(isinstance(op, Const) or id(op) in value for op in ins):
                value[id(node.out)] = evaluate_nodes([node], {op: value[id(op)] for op in ins if isinstance(op, Var)})[node.out]
                continue

            def z(op: Any) -> Any:
                if isinstance(op, Const):
                    return np.asarray(op.scalar() == 0)
                if id(op) in value:
                    return value[id(op)] == 0
                return zero.get(id(op), np.asarray(False))

            def t(op: Any) -> Any:
                if isinstance(op, Const):
                    return np.asarray(np.dtype(op.dtype).kind == "f" and op.scalar() <= EXP_ZERO_BELOW)  # type: ignore[operator]
                if id(op) in value:
                    return np.asarray(value[id(op)] <= EXP_ZERO_BELOW) if np.dtype(op.dtype).kind == "f" else np.asarray(False)
                return tiny.get(id(op), np.asarray(False))

            shape = node.out.shape
            if node.prim == "mul":
                zero[id(node.out)] = z(ins[0]) | z(ins[1])
            elif node.prim == "div":
                zero[id(node.out)] = z(ins[0])
            elif node.prim in ("convert_element_type", "neg", "abs") or node.prim in SHAPING:
                zero[id(node.out)] = _mask_as(z(ins[0]), shape)
                tiny[id(node.out)] = _mask_as(t(ins[0]), shape) if node.prim != "abs" else np.asarray(False)
            elif node.prim == "exp":
                zero[id(node.out)] = t(ins[0])
            elif node.prim == "select_n":
                pred = ins[0]
                if isinstance(pred, Var) and id(pred) in value:
                    chosen = np.asarray(value[id(pred)])
                    zero[id(node.out)] = np.where(chosen, z(ins[2]), z(ins[1]))
                    tiny[id(node.out)] = np.where(chosen, t(ins[2]), t(ins[1]))
                else:
                    zero[id(node.out)] = z(ins[1]) & z(ins[2])
            for kind in (zero, tiny):
                if id(node.out) in kind:
                    kind[id(node.out)] = np.broadcast_to(kind[id(node.out)], np.broadcast_shapes(np.shape(kind[id(node.out)]), shape))
    except TooLargeToEvaluate as exc:
        return f"score terms not evaluated: {exc}"

    lower = np.tril(np.ones(a.scores.shape[-2:], bool))
    for node in a.tile_nodes:  # selects whose static predicate is uniform on and below the diagonal
        pred = node.ins[0] if node.prim == "select_n" else None
        if isinstance(pred, Var) and id(pred) in value:
            seen = np.broadcast_to(value[id(pred)], a.scores.shape).reshape((-1,) + a.scores.shape[-2:])[:, lower]
            if seen.all() or not seen.any():
                a.folds[id(node)] = 2 if seen.all() else 1

    def hidden(var: Var) -> np.ndarray:
        if id(var) in value:
            found = np.asarray(value[id(var)] == 0)
        else:
            found = zero.get(id(var), np.asarray(False))
        full = np.broadcast_to(found, a.scores.shape)
        return full.reshape((-1,) + full.shape[-2:]).all(axis=0)

    out = hidden(a.mixed)
    if a.summed is not None:
        out = out & hidden(a.summed)
    return out


def _mask_as(array: Any, shape: tuple[int, ...]) -> Any:
    """A zero mask reshaped along with its value (a reshape that only moves axes of one)."""
    array = np.asarray(array)
    if array.size == int(np.prod(shape)):
        return array.reshape(shape)
    return array


def analyse(task: "Task", size: str) -> LinearAttention | str:
    key = (str(task.path), task.source_digest, size)
    if key not in _ANALYSED:
        found = _matched(task, size)
        if not isinstance(found, str) and size == "cpu":
            assert found.program is not None
            hidden = hidden_keys(found.program, found)
            if isinstance(hidden, np.ndarray):  # too large to evaluate here: every block pair runs
                tril = np.tril(np.ones(hidden.shape, bool))
                if hidden.all(axis=1).any():
                    found = "a query row that sees no key"
                else:
                    found.causal = bool(hidden[~tril].all()) and not hidden[tril].all()
        _ANALYSED[key] = found
    return _ANALYSED[key]


def _matched(task: "Task", size: str) -> LinearAttention | str:
    """The match of the reference as written, else of the reference moved to ``[batch, heads, seq,
    head_dim]`` (``attention_layout``: token-major arguments, another order) with the moves recorded."""
    from maxkernel.templates.attention_layout import canonical_program, find_layout

    program = trace_program(task, size).dce()
    found = match(program)
    if isinstance(found, str):
        layout = find_layout(program)
        if isinstance(layout, str) or layout.identity or any(layout.inserted(slot) is not None for slot in range(3)):
            return found
        program = canonical_program(task, size, layout).dce()
        moved = match(program, moved=True)
        if isinstance(moved, str):
            return f"{moved} (with the arguments read as [batch, heads, seq, head_dim])"
        found, found.layout = moved, layout
    found.program = program
    return found


_ANALYSED: dict[tuple[str, str, str], LinearAttention | str] = {}


def vmem_bytes(a: LinearAttention, block_q: int, block_k: int) -> int:
    """Double-buffered q, k, v, output and leaf blocks, the f32 accumulator and row sum, and the f32 tiles
    of one block pair (four live: Mosaic fuses the elementwise ops between them)."""
    item = np.dtype(a.in_dtype).itemsize
    d, dv = a.q.shape[3], a.v.shape[3]
    blocks = 2 * (block_q * d * item + block_k * (d + dv) * item + block_q * dv * np.dtype(a.out_dtype).itemsize)
    leaves = sum(2 * 4 * (block_q if leaf.rows else 8) * (block_k if leaf.cols else 128) for leaf in a.leaves)
    tiles = 4 * block_q * block_k * 4
    return blocks + leaves + block_q * (dv + 128) * 4 + tiles


class TpuLinearAttentionTemplate:
    name = "tpu_linear_attention"
    description = ("linear attention over the visible block pairs: the reference's score terms on each tile from "
                   "per-position rows and columns, a row-sum normalizer accumulated beside the value product")

    def applies(self, task: "Task", analysis: "TaskAnalysis") -> str | None:
        found = analyse(task, "cpu")
        return found if isinstance(found, str) else None

    def space(self, task: "Task", analysis: "TaskAnalysis", target: str) -> TemplateSpace:
        empty = TemplateSpace(defaults={"block_q": 0}, space={"block_q": []})
        if not tpu_target(target):
            return empty  # a TPU kernel: scalar prefetch
        a = analyse(task, "full")
        if isinstance(a, str):
            return empty
        found = block_pair_space(a.q.shape[2], list(TPU_BLOCKS), list(TPU_BLOCKS),
                                 lambda bq, bk: vmem_bytes(a, bq, bk) <= TPU_VMEM_BUDGET)
        if found is None:
            return empty
        (bq, bk), space = found
        return TemplateSpace(defaults={"block_q": bq, "block_k": bk, "passes": max(_passes(a))},
                             space={**space, "passes": _passes(a)})

    def render(self, task: "Task", params: dict[str, Any], sizes: tuple[str, ...]) -> str:
        cpu = analyse(task, "cpu")
        if isinstance(cpu, str):
            raise EmitError(cpu)
        found = {}
        for size in sizes:
            a = analyse(task, size)
            if isinstance(a, str):
                raise EmitError(a)
            a.causal = cpu.causal
            if a is not cpu:  # the same program traced at another size: the same selects, in order
                selects = [n for n in a.tile_nodes if n.prim == "select_n"]
                chosen = {i: cpu.folds.get(id(n)) for i, n in enumerate(n for n in cpu.tile_nodes if n.prim == "select_n")}
                a.folds = {id(n): chosen[i] for i, n in enumerate(selects) if chosen.get(i) is not None}
            found[size] = a
        return render_linear_attention(task, found, int(params["block_q"]), int(params.get("block_k", params["block_q"])),
                                       chosen_passes(cpu, params))


def _operand(op: Any, names: dict[int, str], statics: set[str]) -> str:
    if isinstance(op, Const) and op.static is not None:
        statics.add(op.static[0])
        text = static_text(op.static)
        return f"({text})" if " " in text or text.startswith("-") else text
    if isinstance(op, Const):
        return scalar_text(op.scalar())
    return names[id(op)]


def tile_line(node: Node, names: dict[int, str], statics: set[str], counted: dict[int, str] | None = None) -> str:
    """One node of the score work (or of what follows the value product) on 2-D tiles that broadcast as
    numpy does (rows ``[bq, 1]``, columns ``[1, bk]``): the reference's op, an iota made from the block's
    first row (``row0``) or column (``col0``), a reduction over the head dimension kept as a column, a mean's
    count read from the tile it averaged."""
    ins = [_operand(op, names, statics) for op in node.ins]
    prim = node.prim
    if counted and id(node) in counted:
        return f"{ins[0]} / {counted[id(node)]}"
    if prim in SHAPING:
        return ins[0]
    if prim in ROW_REDUCTIONS:
        return f"{ROW_REDUCTIONS[prim]}({ins[0]}, axis=-1, keepdims=True)"
    if prim == "iota":
        along = int(node.params["dimension"]) - (len(node.out.shape) - 2)
        shape = "(block_q, 1)" if along == 0 else "(1, block_k)"
        iota = f"{('row0', 'col0')[along]} + jax.lax.broadcasted_iota(jnp.int32, {shape}, {along})"
        return iota if np.dtype(node.out.dtype) == np.dtype("int32") else f"({iota}).astype({dtype_expr(node.out.dtype)})"
    if prim == "convert_element_type" and isinstance(node.ins[0], Const):
        return f"jnp.asarray({ins[0]}, {dtype_expr(node.params['new_dtype'])})"
    if prim == "convert_element_type":
        return f"{ins[0]}.astype({dtype_expr(node.params['new_dtype'])})"
    if prim == "select_n":
        return f"jnp.where({ins[0]}, {ins[2]}, {ins[1]})"
    if prim == "neg":
        return f"-{ins[0]}"
    if prim == "integer_pow":
        return f"{ins[0]} ** {int(node.params['y'])}"
    if prim in INFIX:
        return f"{ins[0]} {INFIX[prim]} {ins[1]}"
    return f"{CALLS[prim]}({', '.join(ins)})"


def _counted(program: Program, nodes: list[Node], names: dict[int, str]) -> dict[int, str]:
    """For ``sum / n`` where n is the extent the sum reduced over the head dimension (how ``jnp.mean`` and
    ``jnp.var`` divide): that extent as the reduced tile's last dimension, so one body serves every size."""
    producers = program.producers()
    found = {}
    for node in nodes:
        if node.prim != "div" or not isinstance(node.ins[1], Const) or node.ins[1].static is not None:
            continue
        source = producers.get(node.ins[0]) if isinstance(node.ins[0], Var) else None
        while source is not None and (source.prim in SHAPING or source.prim == "convert_element_type"):
            source = producers.get(source.ins[0]) if isinstance(source.ins[0], Var) else None
        if source is None or source.prim != "reduce_sum" or not isinstance(source.ins[0], Var):
            continue
        if float(source.ins[0].shape[-1]) == float(node.ins[1].scalar()):  # type: ignore[arg-type]
            found[id(node)] = f"{names[id(source.ins[0])]}.shape[-1]"
    return found


def _names(program: Program) -> dict[int, str]:
    from maxkernel.rewrites.names import Namer

    namer = Namer(program)
    reserved = {"q", "k", "v", "s", "t", "h", "b", "acc", "rows", "cols", "block_q", "block_k", "flags", "jnp", "jax",
                "pl", "pltpu", "np", "math", "functools"}
    out: dict[int, str] = {}
    taken: set[str] = set()
    for var in [*program.inputs, *(o for n in program.nodes for o in n.outs)]:
        name = namer(var)
        base = name if name not in reserved else f"{name}_"
        while base in taken:
            base += "_"
        taken.add(base)
        out[id(var)] = base
    return out


SCHEDULE_SOURCE = '''def _fit_rows(block, extent, rows):
    """Rows of the sequence a block: the largest divisor of the extent that is at most the block and a
    multiple of a tile (``rows``), so a length such as 896 keeps blocks of 448 where halving would leave 128
    and seven times the steps; else the block halved until it divides the extent."""
    if extent <= block:
        return extent
    for size in range(block // rows * rows, rows - 1, -rows):
        if extent % size == 0:
            return size
    return _fit(block, extent)


def _schedule(seq, block_q, block_k, causal):
    """The grid steps, row by row: every (query block, key block) pair, or with ``causal`` those with a key
    at or before a query."""
    q_blocks, kv_blocks, flags = [], [], []
    for i in range(seq // block_q):
        last = (min(seq // block_k, -(-(i + 1) * block_q // block_k)) if causal else seq // block_k) - 1
        for j in range(last + 1):
            q_blocks.append(i)
            kv_blocks.append(j)
            flags.append((FIRST if j == 0 else 0) | (LAST if j == last else 0))
    return tuple(jnp.asarray(np.asarray(x, dtype=np.int32)) for x in (q_blocks, kv_blocks, flags))


def _term_block(term, block_q, block_k):
    """A score term as [batch or 1, heads or 1, seq or 1, seq or 1] (booleans as int32) and the block of it
    each step reads: its rows of the query block, its columns of the key block, one value per head."""
    term = term.reshape((1,) * (4 - term.ndim) + term.shape)
    if term.dtype == jnp.bool_:
        term = term.astype(jnp.int32)
    batched, headed, rows, cols = (n > 1 for n in term.shape)
    block = (None, None, block_q if rows else 1, block_k if cols else 1)
    at = lambda b, h, t, qb, kb, f: (b if batched else 0, h if headed else 0, qb[t] if rows else 0, kb[t] if cols else 0)
    return term, pl.BlockSpec(block, at)
'''


def _sorted_leaves(a: LinearAttention) -> list[Leaf]:
    """The leaves in the order their values are made (the inputs first)."""
    assert a.program is not None
    producers = a.program.producers()
    return sorted([leaf for leaf in a.leaves if leaf.position is None], key=lambda leaf: a.program.nodes.index(producers[leaf.var]) if leaf.var in producers else -1)


def _terms(task: "Task", found: dict[str, LinearAttention]) -> tuple[list[str], list[list[str]]]:
    """Each leaf's function (its value from the reference's ops; q and k give it the sizes) and the statics it
    reads. One function where every size writes it alike from the sizes alone; a constant per head the
    reference computed on the host (an array in its program) becomes a table by head count; else it is
    refused."""
    from maxkernel.analysis.statics import header_statics

    sizes = list(found)
    per_size = {size: _sorted_leaves(a) for size, a in found.items()}
    texts: list[str] = []
    statics: list[list[str]] = []
    for index in range(len(per_size[sizes[0]])):
        name = f"_term_{index}"
        written = {}
        for size, a in found.items():
            assert a.program is not None
            program, leaf = a.program, per_size[size][index]
            carriers = [a.q, a.k]
            read = [p for p in program.inputs if p.name in program.reads(leaf.var) and p not in carriers]
            term = Program(carriers + read, program.ancestors(leaf.var), [leaf.var])
            written[size] = emit_function(term, name, f"{_names(program)[id(leaf.var)]}: a score term the kernel "
                                          "reads per block; q and k give it the sizes.", statics=True)
        leaf = per_size[sizes[0]][index]
        program = found[sizes[0]].program
        assert program is not None
        fixed = any(isinstance(op, Const) and op.size > 1 for n in program.ancestors(leaf.var) for op in n.ins)
        if len(set(written.values())) == 1 and not fixed:
            texts.append(written[sizes[0]])
        elif not leaf.reads_inputs and leaf.aligned[0] == leaf.aligned[2] == leaf.aligned[3] == 1:
            texts.append(_head_table(name, {size: per_size[size][index].var for size in sizes}, found))
        else:
            raise EmitError("a score term written differently at each size")
        statics.append(header_statics(texts[-1], name))
    return texts, statics


def _head_table(name: str, leaves: dict[str, Var], found: dict[str, LinearAttention]) -> str:
    """A constant per head, as the reference computes it for each head count rendered, refusing another."""
    rows = {}
    for size, var in leaves.items():
        program = found[size].program
        assert program is not None
        value = np.asarray(evaluate_nodes(program.ancestors(var), {})[var]).reshape(-1)
        rows[int(value.size)] = ", ".join(repr(float(x)) for x in value)
    table = "\n".join(f"    {heads}: ({values},)," for heads, values in sorted(rows.items()))
    dtype = dtype_expr(next(iter(leaves.values())).dtype)
    return "\n".join([
        f"{name.upper()} = {{  # one value per head, by head count: the reference's constants",
        table,
        "}",
        "",
        "",
        f"def {name}(q, k):",
        '    """A constant per head for the head counts the candidate was rendered for."""',
        "    heads = q.shape[1]",
        f"    if heads not in {name.upper()}:",
        f"        raise ValueError(f'no score term for {{heads}} heads (known: {{sorted({name.upper()})}})')",
        f"    return jnp.asarray({name.upper()}[heads], {dtype}).reshape(heads, 1, 1)",
    ])


def _kernel_source(task: "Task", a: LinearAttention, terms_statics: list[list[str]]) -> str:
    """The kernel body and its wrapper for one size's analysis (every size must write them alike)."""
    program = a.program
    assert program is not None and a.product is not None
    names = _names(program)
    q, k, v = a.names
    static = list(static_args(task, "cpu"))
    positions = [leaf for leaf in a.leaves if leaf.position is not None]
    leaves = _sorted_leaves(a)
    used: set[str] = set()
    normalized = a.divisor is not None
    scale = ""
    if a.q_factor != 1.0:
        scale = (" * q_ref.shape[-1] ** -0.5" if np.isclose(a.q_factor, a.q.shape[3] ** -0.5, rtol=1e-6)
                 else f" * {a.q_factor!r}")
    lines = ["    t = pl.program_id(2)",
             "    flags = flags_ref[t]",
             "",
             "    @pl.when((flags & FIRST) != 0)",
             "    def _init():",
             "        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)"]
    if normalized:
        lines.append("        sum_ref[...] = jnp.zeros(sum_ref.shape, jnp.float32)")
    lines += ["",
              "    row0 = q_blocks_ref[t] * block_q  # the block's first query and first key",
              "    col0 = kv_blocks_ref[t] * block_k",
              f"    {names[id(a.scores)]} = _scores(q_ref[...], k_ref[...]){scale}"]
    if a.folds:
        lines += ["    below = row0 >= col0 + block_k - 1  # the block lies wholly below the diagonal",
                  "",
                  "    @pl.when(jnp.logical_not(below))",
                  "    def _crossed():  # the diagonal crosses the block: every term as the reference writes it"]
        lines += _step_lines(a, names, used, positions, leaves, False, "        ")
        lines += ["",
                  "    @pl.when(below)",
                  "    def _below():  # the selects of positions alone take one case everywhere here"]
        lines += _step_lines(a, names, used, positions, leaves, True, "        ")
    else:
        lines += _step_lines(a, names, used, positions, leaves, False, "    ")
    lines += ["",
              "    @pl.when((flags & LAST) != 0)",
              "    def _finish():  # once per row block"]
    result = "acc_ref[...]"
    if normalized:
        lines.append(f"        {names[id(a.row_sum)]} = sum_ref[...]")
        for node in a.row_nodes:
            lines.append(f"        {names[id(node.out)]} = {tile_line(node, names, used)}")
        result = f"acc_ref[...] {'/' if a.divides else '*'} {names[id(a.divisor)]}"
    lines.append(f"        {names[id(a.product)]} = ({result}).astype({dtype_expr(a.product.dtype)})")
    if a.tail:
        lines.append("        # What the reference does with each row of the product, as it does it:")
    counted = _counted(program, a.tail, names)
    for node in a.tail:
        lines.append(f"        {names[id(node.out)]} = {tile_line(node, names, used, counted)}")
    written = program.outputs[0] if a.tail else a.product
    lines.append(f"        o_ref[...] = {names[id(written)]}.astype(o_ref.dtype)")
    body_statics = sorted(used)
    header = (f"def _linear_attention_kernel(q_blocks_ref, kv_blocks_ref, flags_ref, q_ref, k_ref, v_ref, "
              f"{''.join(f'term_{i}_ref, ' for i in range(len(leaves)))}o_ref, acc_ref"
              f"{', sum_ref' if normalized else ''}, *, block_q, block_k{''.join(', ' + n for n in body_statics)}):")
    # --- the wrapper
    keywords = f", *, {', '.join(static)}" if static else ""
    entry = "kernel" if a.layout is None else "_linear_attention"
    params = arg_names(task) if a.layout is None else [p.name for p in program.inputs]
    wrapper = [f"def {entry}({', '.join(params)}{keywords}):",
               f"    batch, heads, seq, head_dim = {q}.shape",
               f"    rows = 32 // {q}.dtype.itemsize  # a sublane tile of this dtype",
               "    block_q, block_k = _fit_rows(BLOCK_Q, seq, rows), _fit_rows(BLOCK_K, seq, 128)",
               "    q_blocks, kv_blocks, flags = _schedule(seq, block_q, block_k, CAUSAL)",
               "    index = lambda b, h, t, qb, kb, f: (b, h, qb[t], 0)",
               "    kv_index = lambda b, h, t, qb, kb, f: (b, h, kb[t], 0)",
               "    in_specs = [pl.BlockSpec((None, None, block_q, head_dim), index),",
               "                pl.BlockSpec((None, None, block_k, head_dim), kv_index),",
               f"                pl.BlockSpec((None, None, block_k, {v}.shape[3]), kv_index)]",
               "    terms = []"]
    for index, leaf in enumerate(leaves):
        read = [p for p in program.inputs if p.name in program.reads(leaf.var) and p not in (a.q, a.k)]
        passed = "".join(f", {n}={n}" for n in terms_statics[index])
        call = f"_term_{index}({', '.join(p.name for p in [a.q, a.k] + read)}{passed})"
        wrapper += [f"    term, spec = _term_block(jnp.asarray({call}), block_q, block_k)  # {names[id(leaf.var)]}",
                    "    terms.append(term)",
                    "    in_specs.append(spec)"]
    scratch = [f"pltpu.VMEM((block_q, {v}.shape[3]), jnp.float32)"]
    if normalized:
        scratch.append("pltpu.VMEM((block_q, 1), jnp.float32)")
    passed = "".join(f", {n}={n}" for n in body_statics)
    wrapper += ["    grid_spec = pltpu.PrefetchScalarGridSpec(",
                "        num_scalar_prefetch=3,",
                "        grid=(batch, heads, flags.shape[0]),",
                "        in_specs=in_specs,",
                f"        out_specs=pl.BlockSpec((None, None, block_q, {v}.shape[3]), index),",
                f"        scratch_shapes=[{', '.join(scratch)}],",
                "    )",
                "    return pl.pallas_call(",
                f"        functools.partial(_linear_attention_kernel, block_q=block_q, block_k=block_k{passed}),",
                "        grid_spec=grid_spec,",
                f"        out_shape=jax.ShapeDtypeStruct({q}.shape[:3] + ({v}.shape[3],), {dtype_expr(a.out_dtype)}),",
                '        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),',
                f"    )(q_blocks, kv_blocks, flags, {q}, {k}, {v}, *terms)",
                ""]
    if a.layout is not None:
        from maxkernel.templates.attention_layout import wrapper_source

        wrapper += ["", wrapper_source(arg_names(task), a.layout, tuple(static), entry)]
    return "\n".join([header, *lines, "", "", *wrapper])


def _step_lines(a: LinearAttention, names: dict[int, str], used: set[str], positions: list[Leaf], leaves: list[Leaf],
                folded: bool, indent: str) -> list[str]:
    """One step's score terms and accumulations; with ``folded``, each folded select is its case and only
    what the tiles still need is computed."""
    assert a.program is not None
    producers = a.program.producers()
    needed = {id(a.mixed)} | ({id(a.summed)} if a.summed is not None else set())
    for node in reversed(a.tile_nodes):
        if id(node.out) in needed:
            ins = [node.ins[a.folds[id(node)]]] if folded and id(node) in a.folds else node.ins
            needed.update(id(op) for op in ins if isinstance(op, Var))
    lines = []
    for leaf in positions:
        if id(leaf.var) in needed:
            iota = ("row0 + jax.lax.broadcasted_iota(jnp.int32, (block_q, 1), 0)" if leaf.position == 0 else
                    "col0 + jax.lax.broadcasted_iota(jnp.int32, (1, block_k), 1)")
            if np.dtype(leaf.var.dtype) != np.dtype("int32"):
                iota = f"({iota}).astype({dtype_expr(leaf.var.dtype)})"
            lines.append(f"{indent}{names[id(leaf.var)]} = {iota}  # positions")
    loads = {id(leaf.var): index for index, leaf in enumerate(leaves)}
    for index, leaf in enumerate(leaves):
        if leaf.var not in producers and id(leaf.var) in needed:
            lines.append(f"{indent}{names[id(leaf.var)]} = {_leaf_load(leaf, index)}")
    for node in a.program.nodes:
        if node in a.tile_nodes and id(node.out) in needed:
            if folded and id(node) in a.folds:
                lines.append(f"{indent}{names[id(node.out)]} = {_operand(node.ins[a.folds[id(node)]], names, used)}")
            else:
                lines.append(f"{indent}{names[id(node.out)]} = {tile_line(node, names, used)}")
        for out in node.outs:
            if id(out) in loads and id(out) in needed:
                lines.append(f"{indent}{names[id(out)]} = {_leaf_load(leaves[loads[id(out)]], loads[id(out)])}")
    mixed = names[id(a.mixed)]
    if np.dtype(a.mixed.dtype) != np.dtype(a.mixed_dtype):
        mixed = f"{mixed}.astype({dtype_expr(a.mixed_dtype)})"
    lines.append(f"{indent}acc_ref[...] += _mix({mixed}, v_ref[...])")
    if a.summed is not None:
        lines.append(f"{indent}sum_ref[...] += jnp.sum({names[id(a.summed)]}, axis=1, keepdims=True)")
    return lines


def render_linear_attention(task: "Task", found: dict[str, LinearAttention], block_q: int, block_k: int,
                            passes: int) -> str:
    terms, terms_statics = _terms(task, found)
    kernels = {_kernel_source(task, a, terms_statics) for a in found.values()}
    if len(kernels) != 1:
        raise EmitError("the score work is not written the same at every size")
    a = next(iter(found.values()))
    normalized = a.divisor is not None
    doc = (f'"""{task.id}: {TPU_LINEAR_ATTENTION.description}.\n\n'
           f"Grid (batch, head, step): the steps are the (query block, key block) pairs "
           f"{'on or below the diagonal' if a.causal else 'of every block'}, row by row, prefetched as scalars.\n"
           "Each step scores its block, runs the reference's score terms on the tile (their per-position rows and\n"
           "columns computed by XLA, the iotas from the block's offsets) and accumulates the tile times the values\n"
           f"in f32{'; the row sum the normalizer reads accumulates beside it and divides once' if normalized else ''}"
           f"{'; what the reference does with each output row runs after the last key block' if a.tail else ''}.\n"
           f"{passes} bf16 MXU pass{'es' if passes > 1 else ''} per product. Generated by MaxKernel's rules brain.\n"
           '"""\n')
    return "\n".join([
        doc,
        HEADER + "import numpy as np\n",
        f"BLOCK_Q = {block_q}  # query rows per block",
        f"BLOCK_K = {block_k}  # keys per block",
        f"CAUSAL = {a.causal}  # the score terms are zero above the diagonal whatever the inputs",
        "FIRST, LAST = 1, 2  # step flags: a row's first key block, its last",
        "",
        "",
        FIT_SOURCE,
        "",
        "",
        SCHEDULE_SOURCE,
        "",
        "\n\n".join(terms),
        "",
        "",
        _mxu_source(str(W_NK_DIMENSIONS), passes, "_scores"),
        _mxu_source(str(W_KN_DIMENSIONS), passes, "_mix", split=False),
        kernels.pop(),
    ])


def _leaf_load(leaf: Leaf, index: int) -> str:
    return f"term_{index}_ref[...]" + (" != 0" if np.dtype(leaf.var.dtype) == np.dtype(bool) else "")


TPU_LINEAR_ATTENTION = TpuLinearAttentionTemplate()
