"""TPU MLP: two matmuls in a chain in one kernel, the hidden activation never written to HBM.

What an expert writes for ``tail(act(x @ W1[, x @ W1']) @ W2)`` (a SwiGLU feed-forward block, a two-layer
MLP reduced per row) on a TPU:
- a (row blocks, hidden blocks) grid: each step multiplies a block of rows of x by a block of hidden
  columns of the first weight(s) on the MXU, applies the activation (``silu(gate) * up``, a bias and a
  sigmoid) to that [rows, hidden] tile in VMEM, and accumulates its product with the matching rows of the
  second weight into an f32 [rows, N] tile; the hidden blocks are the second matmul's contraction, so they
  are innermost and ``arbitrary``, the row blocks ``parallel``;
- the output tile holds whole rows, so what follows the second matmul runs on the last hidden step, also
  when it reduces along the row (logsumexp), and the tile is written once;
- MXU operands as tpu_gemm multiplies them (its ``_product``): bf16 in, f32 accumulated; f32 inputs at
  ``HIGHEST`` either in three bf16 passes or at ``HIGHEST``, both in the tuning space.
Every shape is read from the arguments, and ``BLOCK_M`` and ``BLOCK_H`` are halved only to divide a
smaller extent, so the body priced at ``full`` is the one checked at a smaller twin size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from maxkernel.analysis.graph import ELEMENTWISE, REDUCE
from maxkernel.analysis.program import Node, Program, Var, arg_names, trace_program
from maxkernel.rewrites.activations import cheaper_activations
from maxkernel.rewrites.emit import EmitError, dtype_expr, emit_function, emittable
from maxkernel.targets.check_size import CHECK_FLOPS
from maxkernel.templates.base import FIT_SOURCE, TemplateSpace, tpu_target
from maxkernel.templates.tpu_gemm import (HEADER, HIGHEST, TPU_BLOCKS_M, W_KN_DIMENSIONS, W_NK_DIMENSIONS,
                                          _mxu_source, _passes, chosen_passes)

if TYPE_CHECKING:
    from jaxbench.task import Task
    from maxkernel.analysis import TaskAnalysis

# The share of the check's FLOP limit (``targets.check_size.CHECK_FLOPS``) a twin may be estimated at: the
# estimate counts the two products only.
CHECK_SHARE = 0.8
TPU_BLOCKS_H = (128, 256, 512, 1024)  # hidden columns per step: lane-aligned, the second matmul's contraction
# Hidden columns a step should have at least: two 128-lane tiles, the width of v6e's MXU; past it a wider
# step only saves per-step overhead, while its weight blocks take VMEM the row block could use.
PREFERRED_BLOCK_H = 256
# VMEM the chain may plan for, as a share of the chip's: every row block reads every weight once, so the
# rows a step holds (x, the f32 accumulator and the output rows, all [rows, width]) set the HBM traffic,
# and they are worth more VMEM than the single GEMM's share.
MLP_VMEM_SHARE = 0.75
# Row blocks below the GEMM's smallest, for decode batches (a few dozen tokens): all their rows in one
# step, so the weights stream past them once; tried only where no larger block divides the rows.
DECODE_BLOCKS_M = (8, 16, 32, 64)


@dataclass
class ChainPlan:
    """The first matmul(s) of x, the activation on their products, the second matmul, and what follows."""

    m: int  # rows of x (its leading axes flattened)
    k: int
    hidden: int
    n: int
    x: Var
    firsts: list[Var]  # the first-stage weights, in the order the activation reads their products
    second: Var
    w_nk: bool  # every weight is stored [out, in] and contracted on its dim 1
    in_dtype: np.dtype
    precision: str
    act: Program  # inputs: the first-stage products, then vectors of [hidden]; output: the second's lhs
    tail: Program  # inputs: the second product, then vectors of [n]; output: the reference's
    tileable: bool  # the tail is elementwise (else it reduces along whole rows of the second product)
    # One first weight holding every first stage side by side (a fused gate/up weight, its product split
    # into equal column parts): the number of parts, each read through its own block index; 0 if separate.
    fused_parts: int = 0
    act_text: str = ""
    tail_text: str = ""

    @property
    def out(self) -> Var:
        out = self.tail.outputs[0]
        assert isinstance(out, Var)
        return out

    @property
    def hidden_dtype(self) -> np.dtype:
        return np.dtype(self.act.outputs[0].dtype)


def _weight(program: Program, dot: Node, rank: int) -> tuple[Var, bool, list[Node]] | str:
    """The 2-D input ``dot`` contracts its lhs's last axis with, its layout, and the transpose it reads."""
    (lc, rc), (lb, rb) = dot.params["dimension_numbers"]
    if lb or rb or tuple(lc) != (rank - 1,):
        return "a matmul that is not over the last axis of its left operand"
    rhs = dot.ins[1]
    src = program.producers().get(rhs) if isinstance(rhs, Var) else None
    if rhs in program.inputs and len(rhs.shape) == 2 and tuple(rc) in ((0,), (1,)):
        return rhs, tuple(rc) == (1,), []
    if (src is not None and src.prim == "transpose" and src.ins[0] in program.inputs and tuple(rc) == (0,)
            and len(src.ins[0].shape) == 2 and tuple(src.params["permutation"]) == (1, 0)):
        w = src.ins[0]
        assert isinstance(w, Var)
        return w, True, [src]
    return "a weight that is not a 2-D input (or its transpose)"


def _column_parts(program: Program, product: Var) -> tuple[list[Var], list[Node]] | None:
    """The equal column parts ``product`` is read through, in column order, and the nodes that cut them:
    one ``split`` of its last axis, or unit-stride slices of it that tile the last axis; None otherwise."""
    readers = [nd for nd in program.nodes if product in nd.ins]
    if not readers or product in program.outputs:
        return None
    last = len(product.shape) - 1
    width = product.shape[last]
    if len(readers) == 1 and readers[0].prim == "split":
        node = readers[0]
        sizes = [int(v) for v in node.params["sizes"]]
        if int(node.params["axis"]) != last or len(sizes) < 2 or len(set(sizes)) != 1:
            return None
        return list(node.outs), [node]
    pieces: list[tuple[int, Var]] = []
    for node in readers:
        if node.prim != "slice" or any(int(v) != 1 for v in node.params.get("strides") or ()):
            return None
        start, limit = tuple(node.params["start_indices"]), tuple(node.params["limit_indices"])
        if any(start[a] != 0 or limit[a] != product.shape[a] for a in range(last)):
            return None
        pieces.append((int(start[last]), node.out))
    pieces.sort(key=lambda piece: piece[0])
    size = width // len(pieces) if len(pieces) >= 2 else 0
    if not size or [start for start, _ in pieces] != [i * size for i in range(len(pieces))] or any(
            v.shape[last] != size for _, v in pieces):
        return None
    return [v for _, v in pieces], list(readers)


def _precision(dot: Node) -> str:
    precision = dot.params.get("precision")
    levels = precision if isinstance(precision, (tuple, list)) else (precision,)
    names = {str(getattr(p, "name", p)).upper() for p in levels if p is not None}
    return HIGHEST if HIGHEST in names else "DEFAULT"


def _subprogram(program: Program, nodes: list[Node], products: list[tuple[Var, Var]], width: int,
                outputs: list[Any], out_tree: Any) -> Program | str:
    """``nodes`` as a program of the products (renamed) and the vectors of ``width`` they read."""
    produced = {out for nd in nodes for out in nd.outs}
    others = [v for v in program.inputs if any(v in nd.ins for nd in nodes)]
    if any(v.shape != (width,) for v in others):
        return "the activation or the epilogue reads an input that is not a vector along its columns"
    stray = {op for nd in nodes for op in nd.ins if isinstance(op, Var)} - produced - set(others) - {p for p, _ in products}
    if stray:
        return "the computation after a matmul reads values computed before it"
    sub = Program([new for _, new in products] + others,
                  [Node(nd.primitive, list(nd.ins), list(nd.outs), dict(nd.params)) for nd in nodes],
                  outputs, out_tree)
    for old, new in products:
        sub.substitute(old, new)
    cheaper_activations(sub)  # erfc (exact GELU) has no Mosaic lowering; 1 - erf has
    return sub.dce()


def row_local(tail: Program, m: int) -> bool:
    """Each output row of ``tail`` reads only its own row of the product (and vectors along the columns):
    elementwise steps, reductions and squeezes that keep axis 0, broadcasts of scalars and column vectors
    or that keep axis 0. Then the tail may run on whole-row tiles of any number of rows."""
    for nd in tail.nodes:
        operand = nd.ins[0]
        if nd.prim in ELEMENTWISE:
            continue
        if nd.prim in REDUCE and 0 not in tuple(nd.params["axes"]):
            continue
        if nd.prim == "squeeze" and 0 not in tuple(nd.params["dimensions"]) and operand.shape[:1] == (m,):
            continue
        if nd.prim == "broadcast_in_dim":
            dims = tuple(nd.params["broadcast_dimensions"])
            shape = tuple(nd.params["shape"])
            if not operand.shape or (len(operand.shape) == 1 and dims == (len(shape) - 1,) and shape[0] == 1):
                continue
            if dims[:1] == (0,) and operand.shape[0] == m and shape[0] == m:
                continue
        return False
    return True


def match(program: Program) -> ChainPlan | str:
    """The two-matmul chain of ``program``, or why it has none."""
    dots = [nd for nd in program.nodes if nd.prim == "dot_general"]
    if len(dots) not in (2, 3):
        return f"{len(dots)} matmuls (the template chains one or two first matmuls of x into a second)"
    *first_dots, second_dot = dots
    x = first_dots[0].ins[0]
    if x not in program.inputs or len(x.shape) < 2 or any(d.ins[0] is not x for d in first_dots):
        return "the first matmuls are not of one input x"
    rank = len(x.shape)
    upstream: list[Node] = list(dots)
    weights: list[tuple[Var, bool]] = []
    for dot in dots:
        found = _weight(program, dot, rank)
        if isinstance(found, str):
            return found
        weights.append(found[:2])
        upstream += found[2]
    if len({nk for _, nk in weights}) != 1:
        return "weights stored in different layouts"
    w_nk = weights[0][1]
    if len({np.dtype(v.dtype) for v in [x] + [w for w, _ in weights]}) != 1 or np.dtype(x.dtype) not in (
            np.dtype("float32"), np.dtype("bfloat16")):
        return "operands that are not all float32 or all bfloat16"
    if len({_precision(d) for d in dots}) != 1:
        return "matmuls at different precisions"
    first_products = [d.out for d in first_dots]
    parts = _column_parts(program, first_dots[0].out) if len(first_dots) == 1 else None
    if parts is not None:  # one fused weight whose product is cut into the stages' columns
        first_products, cuts = parts
        upstream += cuts
    hidden_in = second_dot.ins[0]
    if not isinstance(hidden_in, Var) or len(hidden_in.shape) != rank:
        return "the second matmul's left operand is not the activation of the first products"
    if len(program.outputs) != 1 or not isinstance(program.outputs[0], Var):
        return "the output is not one array"
    upstream_ids = {id(nd) for nd in upstream}
    act_nodes = [nd for nd in program.ancestors(hidden_in) if id(nd) not in upstream_ids]
    if any(nd.prim not in ELEMENTWISE and nd.prim != "broadcast_in_dim" for nd in act_nodes):
        return "the activation between the matmuls is not elementwise"
    act_ids = {id(nd) for nd in act_nodes}
    tail_nodes = [nd for nd in program.nodes if id(nd) not in upstream_ids and id(nd) not in act_ids]
    m = int(np.prod(x.shape[:-1]))
    k = int(x.shape[-1])
    hidden = int(first_products[0].shape[-1])
    n = int(second_dot.out.shape[-1])
    dtype = np.dtype(first_dots[0].out.dtype)
    firsts = [Var(f"first{i}", tuple(v.shape), v.dtype) for i, v in enumerate(first_products)]
    act = _subprogram(program, act_nodes, list(zip(first_products, firsts)), hidden, [hidden_in], None)
    if isinstance(act, str):
        return act
    if [v.name for v in act.inputs[: len(firsts)]] != [v.name for v in firsts] or any(
            not any(v in nd.ins for nd in act.nodes) for v in firsts):
        return "a first product the activation does not read"
    product = Var("second", tuple(second_dot.out.shape), second_dot.out.dtype)
    tail = _subprogram(program, tail_nodes, [(second_dot.out, product)], n, list(program.outputs), program.out_tree)
    if isinstance(tail, str):
        return tail
    out = tail.outputs[0]
    assert isinstance(out, Var)
    tileable = out.shape == product.shape and all(nd.prim in ELEMENTWISE or nd.prim == "broadcast_in_dim"
                                                  for nd in tail.nodes)
    if not tileable and not (rank == 2 and out.shape and out.shape[0] == m and row_local(tail, m)):
        return "the computation after the second matmul couples rows"
    if rank > 2 and any(nd.prim == "broadcast_in_dim" and nd.ins[0].shape for nd in act.nodes + tail.nodes):
        return "a vector broadcast over the leading axes of a rank-3 x"
    if dtype != np.dtype("float32"):
        return "first products not accumulated in float32"
    first_weights = [w for w, _ in weights[:-1]] * (len(first_products) if parts is not None else 1)
    return ChainPlan(m, k, hidden, n, x, first_weights, weights[-1][0], w_nk, np.dtype(x.dtype), _precision(dots[0]),
                     act, tail, tileable, len(first_products) if parts is not None else 0)


def plan(task: "Task", sizes: tuple[str, ...]) -> ChainPlan | str:
    """The plan at every size; the activation and the epilogue must be written the same at all of them
    (their shapes read from their operands), so that one body serves every size."""
    found: list[ChainPlan] = []
    for size in sizes:
        p = match(trace_program(task, size).dce())
        if isinstance(p, str):
            return p
        for sub in (p.act, p.tail):
            reason = emittable(sub)
            if reason is not None:
                return reason
        p.act_text = emit_function(p.act, "_activation", "The reference between its matmuls, on a tile of products.")
        p.tail_text = emit_function(p.tail, "_epilogue", "The reference after its second matmul, on whole rows.")
        found.append(p)
    if len({(p.act_text, p.tail_text, p.w_nk, p.in_dtype, p.precision, p.tileable, len(p.firsts), p.fused_parts)
            for p in found}) != 1:
        return "the activation or the epilogue is written differently at different sizes"
    return found[-1]


def chain_vmem_bytes(k: int, n: int, n_first: int, item: int, out_bytes_per_row: int, bm: int, bh: int,
                     passes: int, accumulator: bool = True) -> int:
    """VMEM one step of a matmul chain plans for: double-buffered x rows, weight blocks, bias blocks and
    output rows; the f32 accumulator (unless the f32 output block is it); the f32 first products and the
    hidden tile; the bf16 halves of every operand block when the products are split into three passes."""
    operands = bm * k + n_first * k * bh + bh * n
    blocks = 2 * (operands * item + bm * out_bytes_per_row + 4 * (bh + n))
    products = (n_first + 1) * bm * bh * 4
    split = 2 * 2 * (operands + bm * bh) if passes == 3 else 0
    return blocks + (bm * n * 4 if accumulator else 0) + products + split


def mlp_vmem_bytes(p: ChainPlan, bm: int, bh: int, passes: int) -> int:
    """:func:`chain_vmem_bytes` of this plan's extents and output rows."""
    out_cols = p.n if p.tileable else max(1, int(np.prod(p.out.shape[1:], dtype=np.int64)))
    return chain_vmem_bytes(p.k, p.n, len(p.firsts), p.in_dtype.itemsize, out_cols * np.dtype(p.out.dtype).itemsize,
                            bm, bh, passes)


def chain_vmem_cap(target: str) -> int:
    from maxkernel.targets.specs import load_tpu_specs

    return int(load_tpu_specs()[target.removeprefix("tpu-")].vmem_bytes * MLP_VMEM_SHARE)


Legal = Callable[[int, int, int], bool]  # (rows, hidden columns, VMEM cap) -> whether a step may have them


def chain_space(target: str, rules: Callable[[], tuple[Legal, dict[str, Any], dict[str, list[Any]]]],
                widest: bool = False) -> TemplateSpace:
    """On a TPU target, the (rows, hidden columns) a step that ``rules()`` calls legal, with the defaults
    and space it adds (none elsewhere: Mosaic-only operations). The default has the most rows (each row
    block reads every weight once), then the narrowest hidden step from PREFERRED_BLOCK_H up (a wider one
    costs VMEM and, at the check size, reference FLOPs), or with ``widest`` the widest that fits beside
    those rows (each step then pays its overhead and its operand split for more MXU work); around it half
    the rows and the neighbouring width, where legal."""
    if not tpu_target(target):
        return TemplateSpace(defaults={}, space={"block_m": []})
    legal, defaults, space = rules()
    cap = chain_vmem_cap(target)
    fits = {(bm, bh) for bm in TPU_BLOCKS_M for bh in TPU_BLOCKS_H if legal(bm, bh, cap)}
    fits = fits or {(bm, bh) for bm in DECODE_BLOCKS_M for bh in TPU_BLOCKS_H if legal(bm, bh, cap)}
    if not fits:
        return TemplateSpace(defaults={"block_m": 0}, space={"block_m": []})
    bm = max(b for b, _ in fits)
    widths = sorted(h for b, h in fits if b == bm)
    bh = widths[-1] if widest else min((h for h in widths if h >= PREFERRED_BLOCK_H), default=widths[-1])
    other = bh // 2 if widest else bh * 2
    return TemplateSpace(defaults={"block_m": bm, "block_h": bh, **defaults}, space={
        "block_m": sorted({bm} | ({bm // 2} if (bm // 2, bh) in fits else set())),
        "block_h": sorted({bh} | ({other} if (bm, other) in fits else set())), **space})


def _rules(task: "Task") -> tuple[Legal, dict[str, Any], dict[str, list[Any]]]:
    p = plan(task, ("full",))
    assert not isinstance(p, str)
    admitted = _passes(p, task)
    worst = min(admitted)  # the 3-pass split needs the most VMEM
    sublanes = 16 if p.in_dtype == np.dtype("bfloat16") else 8

    def fits(bm: int, bh: int, cap: int) -> bool:
        return bm % sublanes == 0 and p.m % bm == 0 and p.hidden % bh == 0 and mlp_vmem_bytes(p, bm, bh, worst) <= cap

    # Priced = checked: blocks whose twin small enough to run exists (two row blocks by two hidden blocks
    # at the full width of x) come first; a large MLP's widest row blocks have none.
    small = plan(task, ("cpu",))
    floor_hidden = small.hidden if not isinstance(small, str) else p.hidden
    checkable: dict[int, bool] = {}  # per VMEM cap: whether any block that fits has a twin small enough

    def small_twin(bm: int, bh: int) -> bool:
        return check_flops(p, bm, bh, floor_hidden) <= CHECK_SHARE * CHECK_FLOPS

    def legal(bm: int, bh: int, cap: int) -> bool:
        if not fits(bm, bh, cap):
            return False
        if cap not in checkable:
            checkable[cap] = any(fits(m, h, cap) and small_twin(m, h) for m in TPU_BLOCKS_M + DECODE_BLOCKS_M
                                 for h in TPU_BLOCKS_H)
        return not checkable[cap] or small_twin(bm, bh)

    return legal, {"passes": worst}, {"passes": admitted}


def check_flops(p: ChainPlan, bm: int, bh: int, floor_hidden: int) -> float:
    """FLOPs of the chain's reference at its smallest twin of blocks (bm, bh): two row blocks (or all rows)
    by two hidden blocks (or the task's smallest hidden width, if larger), at the full width of x and out."""
    rows = 2 * bm if p.m >= 2 * bm else p.m
    hidden = min(p.hidden, max(2 * bh if p.hidden >= 2 * bh else p.hidden, floor_hidden))
    return 2.0 * rows * hidden * (p.k * len(p.firsts) + p.n)


class TpuMlpTemplate:
    name = "tpu_mlp"
    description = ("two chained matmuls in one kernel: row blocks by hidden blocks, the activation in VMEM, "
                   "the second product accumulated into whole f32 output rows, the epilogue on them")

    def applies(self, task: "Task", analysis: "TaskAnalysis") -> str | None:
        found = plan(task, ("cpu", "full"))
        return found if isinstance(found, str) else None

    def space(self, task: "Task", analysis: "TaskAnalysis", target: str) -> TemplateSpace:
        # The widest hidden step: the row block is the most VMEM allows already, and a wider step halves
        # the steps' overhead and the re-splits of the row block (32k: 256 -> 1024 columns, 1.80x -> 1.92x).
        return chain_space(target, lambda: _rules(task), widest=True)

    def render(self, task: "Task", params: dict[str, Any], sizes: tuple[str, ...]) -> str:
        p = plan(task, sizes)
        if isinstance(p, str):
            raise EmitError(p)
        passes = chosen_passes(p, params, task)
        doc = (f'"""{task.id}: {self.description}.\n\nGenerated by MaxKernel\'s rules brain: '
               f"{params['block_m']} rows by {params['block_h']} hidden columns a step, {passes} MXU pass"
               f"{'es' if passes > 1 else ''} per product.\n\"\"\"\n")
        constants = (f"BLOCK_M = {int(params['block_m'])}  # rows of x per step (each reads every weight once)\n"
                     f"BLOCK_H = {int(params['block_h'])}  # hidden columns per step (innermost, accumulated)\n")
        mxu = _mxu_source(W_NK_DIMENSIONS if p.w_nk else W_KN_DIMENSIONS, passes)
        return "\n".join([doc, HEADER, constants, FIT_SOURCE, "", mxu, p.act_text, "", "", p.tail_text, "", "",
                          _body_source(p), _kernel_source(p, arg_names(task))])


def _vector(name: str) -> str:
    return f"{name}_ref[...].reshape(({name}_ref.shape[1],))"


def _first_names(p: ChainPlan) -> list[str]:
    """What the kernel calls each first-stage weight block: the argument's name, with the part's number
    when one fused weight is read once per part."""
    if p.fused_parts:
        return [f"{w.name}_{i}" for i, w in enumerate(p.firsts)]
    return [w.name for w in p.firsts]


def _body_source(p: ChainPlan) -> str:
    firsts = _first_names(p)
    act_others = [v.name for v in p.act.inputs[len(p.firsts):]]
    tail_others = [v.name for v in p.tail.inputs[1:]]
    refs = ", ".join(f"{name}_ref" for name in ["x"] + firsts + [p.second.name] + act_others + tail_others)
    act_args = ", ".join([f"_product(x, {w}_ref[...])" for w in firsts] + [_vector(v) for v in act_others])
    tail_args = ", ".join([f"acc_ref[...].astype({dtype_expr(np.dtype(p.tail.inputs[0].dtype))})"]
                          + [_vector(v) for v in tail_others])
    return f'''def _mlp_kernel({refs}, o_ref, acc_ref):
    """One block of rows by one block of hidden columns: the first products and the activation stay in
    VMEM, their product with the second weight's rows accumulates into whole f32 output rows."""
    j = pl.program_id(1)

    @pl.when(j == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    x = x_ref[...]
    hidden = _activation({act_args})
    acc_ref[...] += _product(hidden, {p.second.name}_ref[...])

    @pl.when(j == pl.num_programs(1) - 1)
    def _store():
        o_ref[...] = _epilogue({tail_args}).reshape(o_ref.shape).astype(o_ref.dtype)

'''


def _kernel_source(p: ChainPlan, names: list[str]) -> str:
    x = p.x.name
    w0 = p.firsts[0].name
    hidden_expr = f"{w0}.shape[0]" if p.w_nk else f"{w0}.shape[1]"
    if p.fused_parts:
        hidden_expr += f" // {p.fused_parts}  # {p.fused_parts} equal column parts, one per first stage"
    n_expr = f"{p.second.name}.shape[0]" if p.w_nk else f"{p.second.name}.shape[1]"

    def first_spec(part: int) -> str:  # a fused weight's part starts ``part`` hidden widths along it
        col = f"j + {part} * steps" if part else "j"
        return (f"pl.BlockSpec((block_h, k), lambda i, j: ({col}, 0))" if p.w_nk
                else f"pl.BlockSpec((k, block_h), lambda i, j: (0, {col}))")

    second_spec = ("pl.BlockSpec((n, block_h), lambda i, j: (0, j))" if p.w_nk
                   else "pl.BlockSpec((block_h, n), lambda i, j: (j, 0))")
    act_others = [v.name for v in p.act.inputs[len(p.firsts):]]
    tail_others = [v.name for v in p.tail.inputs[1:]]
    first_specs = [first_spec(i if p.fused_parts else 0) for i in range(len(p.firsts))]
    in_specs = (["pl.BlockSpec((block_m, k), lambda i, j: (i, 0))"] + first_specs + [second_spec]
                + ["pl.BlockSpec((1, block_h), lambda i, j: (0, j))"] * len(act_others)
                + ["pl.BlockSpec((1, n), lambda i, j: (0, 0))"] * len(tail_others))
    operands = (["rows"] + [w.name for w in p.firsts] + [p.second.name] + [f"{v}.reshape((1, hidden))" for v in act_others]
                + [f"{v}.reshape((1, n))" for v in tail_others])
    item = p.in_dtype.itemsize
    tail_in = ", ".join([f"jax.ShapeDtypeStruct((m, n), {dtype_expr(np.dtype(p.tail.inputs[0].dtype))})"] + tail_others)
    if p.tileable:
        shape_lines = [f"    out_shape = {x}.shape[:-1] + (n,)", "    cols = n"]
    else:
        shape_lines = [f"    out_shape = jax.eval_shape(_epilogue, {tail_in}).shape",
                       "    cols = math.prod(out_shape[1:])"]
    lines = [
        f"def kernel({', '.join(names)}, **static):",
        f"    k = {x}.shape[-1]",
        f"    rows = {x}.reshape((-1, k))",
        "    m = rows.shape[0]",
        f"    hidden = {hidden_expr}",
        f"    n = {n_expr}",
        "    block_m, block_h = _fit(BLOCK_M, m), _fit(BLOCK_H, hidden)",
        *(["    steps = hidden // block_h  # hidden blocks a part spans"] if p.fused_parts else []),
        *shape_lines,
        "    # What one step holds (blocks double-buffered, the accumulator, the products, split operands): the",
        "    # limit is raised to it, with headroom for Mosaic's own temporaries.",
        f"    operands = block_m * k + {len(p.firsts)} * k * block_h + block_h * n",
        f"    planned = (2 * (operands * {item} + block_m * cols * 4 + 4 * (block_h + n)) + block_m * n * 4"
        f" + {len(p.firsts) + 1} * block_m * block_h * 4 + 4 * (operands + block_m * block_h))",
        "    out = pl.pallas_call(",
        "        _mlp_kernel,",
        f"        out_shape=jax.ShapeDtypeStruct((m, cols), {dtype_expr(np.dtype(p.out.dtype))}),",
        "        grid=(m // block_m, hidden // block_h),",
        "        in_specs=[" + ", ".join(in_specs) + "],",
        "        out_specs=pl.BlockSpec((block_m, cols), lambda i, j: (i, 0)),",
        "        scratch_shapes=[pltpu.VMEM((block_m, n), jnp.float32)],",
        '        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary"),',
        "                                             vmem_limit_bytes=max(32 << 20, planned + (planned >> 2))),",
        f"    )({', '.join(operands)})",
        "    return out.reshape(out_shape)",
    ]
    return "\n".join(lines) + "\n"


TPU_MLP = TpuMlpTemplate()
