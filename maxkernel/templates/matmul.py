"""Tiled matmul with a fused epilogue generated from the reference's own epilogue ops.

The grid walks (M tiles, N tiles, K tiles) with K innermost; each step multiplies an x tile by a weight
tile (the weight stays in its stored layout, [N, K] or [K, N]) and accumulates in an f32 VMEM scratch
tile. On the last K step the reference's epilogue — every elementwise op after the matmul: bias, scale,
activations, clamps, residual adds — runs on the accumulator, and the tile is written once.

Shape-generic: M, N and K are read from the arguments. Output tiles are ``BLOCK_M`` x ``BLOCK_N``, the
last ones possibly partial (Pallas pads their reads and drops their writes past the end; no output element
reads another's padding); ``BLOCK_K`` is used only where it divides K, else the whole of K is one step,
so padding is never summed into the product.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from maxkernel.analysis.graph import ELEMENTWISE
from maxkernel.analysis.program import Const, Node, Program, Var, arg_names, trace_program
from maxkernel.analysis.statics import keyword_only, passed_on, used_statics
from maxkernel.rewrites.activations import cheaper_activations
from maxkernel.rewrites.emit import EmitError, dtype_expr, emit_function, emittable
from maxkernel.rewrites.source import size_dispatch
from maxkernel.templates.base import TPU_VMEM_BUDGET, TemplateSpace, divisors, pick_block, tpu_target

if TYPE_CHECKING:
    from jaxbench.task import Task
    from maxkernel.analysis import TaskAnalysis

HEADER = ("import functools\n\nimport jax\nimport jax.numpy as jnp\nfrom jax.experimental import pallas as pl\n"
          "from jax.experimental.pallas import tpu as pltpu\n")
SHAPED = {"broadcast_in_dim": "shape", "reshape": "new_sizes", "iota": "shape"}


@dataclass
class MatmulShape:
    m: int
    n: int
    k: int
    x: Var
    w: Var
    w_nk: bool  # weight stored [N, K] (contract its dim 1) rather than [K, N]
    dot: Node
    extras: list[tuple[Var, str]]  # other inputs the epilogue reads: ("bias", [N]) or ("tile", [M, N])
    epilogue: Program


def match(program: Program) -> MatmulShape | str:
    """The matmul-with-epilogue structure of ``program``, or why it does not have one."""
    dots = [n for n in program.nodes if n.prim == "dot_general"]
    if len(dots) != 1:
        return f"{len(dots)} matmuls (the template fuses exactly one)"
    dot = dots[0]
    (lc, rc), (lb, rb) = dot.params["dimension_numbers"]
    lhs, rhs = dot.ins
    producers = program.producers()
    if lb or rb or tuple(lc) != (1,) or len(dot.out.shape) != 2 or lhs not in program.inputs or len(lhs.shape) != 2:
        return "not a plain [M, K] x [K, N] matmul of an input"
    src = producers.get(rhs) if isinstance(rhs, Var) else None
    if rhs in program.inputs and tuple(rc) == (0,):
        w, w_nk = rhs, False
    elif rhs in program.inputs and tuple(rc) == (1,) and len(rhs.shape) == 2:  # [N, K] contracted as stored
        w, w_nk = rhs, True
    elif src is not None and src.prim == "transpose" and src.ins[0] in program.inputs and tuple(rc) == (0,):
        w, w_nk = src.ins[0], True
    else:
        return "the weight is not an input (or its transpose)"
    m, n = dot.out.shape
    k = lhs.shape[1]
    upstream = {id(dot)} | ({id(src)} if w_nk and src is not None else set())
    epi_nodes = [nd for nd in program.nodes if id(nd) not in upstream]
    if any(nd.prim not in ELEMENTWISE and nd.prim not in ("broadcast_in_dim",) for nd in epi_nodes):
        bad = next(nd.prim for nd in epi_nodes if nd.prim not in ELEMENTWISE and nd.prim != "broadcast_in_dim")
        return f"the epilogue holds {bad} (not elementwise)"
    if len(program.outputs) != 1 or getattr(program.outputs[0], "shape", None) != (m, n):
        return "the output is not the [M, N] product"
    acc = Var("acc", (m, n), dot.out.dtype)
    extras: list[tuple[Var, str]] = []
    for v in program.inputs:
        if v is lhs or v is w or not any(v in nd.ins for nd in epi_nodes):
            continue
        if v.shape == (n,):
            extras.append((v, "bias"))
        elif v.shape == (m, n):
            extras.append((v, "tile"))
        else:
            return f"input {v.name} of shape {v.shape} is neither a bias [N] nor an [M, N] tile"
    if any(v in (lhs, w) for nd in epi_nodes for v in nd.ins):
        return "the epilogue reads x or the weight directly"
    epi = Program([acc] + [v for v, _ in extras], [Node(nd.primitive, list(nd.ins), list(nd.outs), dict(nd.params))
                                                   for nd in epi_nodes], list(program.outputs), program.out_tree)
    epi.substitute(dot.out, acc)
    cheaper_activations(epi)  # erfc (exact GELU) has no Mosaic lowering; 1 - erf has
    return MatmulShape(m, n, k, lhs, w, w_nk, dot, extras, epi.dce())


def block_epilogue(shape: MatmulShape, bm: int, bn: int) -> Program:
    """The epilogue with every [M, N]-shaped value resized to one (bm, bn) tile."""
    m, n = shape.m, shape.n

    def tile(s: tuple[int, ...]) -> tuple[int, ...]:
        if len(s) == 2:
            return (bm if s[0] == m else s[0], bn if s[1] == n else s[1])
        if len(s) == 1 and s[0] == n:
            return (bn,)
        if len(s) in (0,):
            return s
        raise EmitError(f"a value of shape {s} does not tile as [M, N]")

    mapping: dict[Var, Var] = {}

    def remap(op: Any) -> Any:
        if isinstance(op, Var):
            if op not in mapping:
                mapping[op] = Var(op.name, tile(op.shape), op.dtype)
            return mapping[op]
        if isinstance(op, Const) and op.shape:
            raise EmitError("a constant array in the epilogue")
        return op

    nodes = []
    for nd in shape.epilogue.nodes:
        params = dict(nd.params)
        if nd.prim in SHAPED:
            params[SHAPED[nd.prim]] = tile(tuple(params[SHAPED[nd.prim]]))
        nodes.append(Node(nd.primitive, [remap(o) for o in nd.ins], [remap(o) for o in nd.outs], params))
    return Program([remap(v) for v in shape.epilogue.inputs], nodes, [remap(o) for o in shape.epilogue.outputs],
                   shape.epilogue.out_tree)


def tile_vmem_bytes(block_m: int, block_n: int, block_k: int) -> int:
    """VMEM of one step: double-buffered x, w and output tiles and the f32 accumulator, as float32."""
    return 4 * (2 * (block_m * block_k + block_k * block_n + block_m * block_n) + block_m * block_n)


class MatmulTemplate:
    name = "matmul_epilogue"
    description = "tiled matmul, K-loop into an f32 VMEM accumulator, the reference's epilogue fused on the last K step"

    def applies(self, task: "Task", analysis: "TaskAnalysis") -> str | None:
        found = match(trace_program(task, "cpu").dce())
        if isinstance(found, str):
            return found
        return emittable(block_epilogue(found, found.m, found.n))

    def space(self, task: "Task", analysis: "TaskAnalysis", target: str) -> TemplateSpace:
        size = "full" if tpu_target(target) else "cpu"
        s = match(trace_program(task, size).dce())
        assert not isinstance(s, str)
        if tpu_target(target):
            bms = [d for d in divisors(s.m) if d % 8 == 0 and d in (128, 256, 512, 1024)] or [s.m]
            bns = [d for d in divisors(s.n) if d % 128 == 0 and d in (128, 256, 512, 1024, 2048)] or [s.n]
            bks = [d for d in divisors(s.k) if d % 128 == 0 and d in (256, 512, 1024, 2048)] or [s.k]
            # The tuner tries every combination of the lists, and VMEM grows with each block: the largest
            # values are dropped (the contraction's first) until the largest combination fits too.
            lists = [sorted(bks), sorted(bns), sorted(bms)]
            while tile_vmem_bytes(lists[2][-1], lists[1][-1], lists[0][-1]) > TPU_VMEM_BUDGET:
                longest = next((x for x in lists if len(x) > 1), None)
                if longest is None:
                    break
                longest.pop()
            bks, bns, bms = lists
            space = {"block_m": bms, "block_n": bns, "block_k": bks}
            return TemplateSpace(defaults={"block_m": bms[-1], "block_n": bns[-1], "block_k": bks[-1]}, space=space)
        # CPU: interpreted grid steps are costly; whole extents or halves only.
        space = {"block_m": sorted({s.m, max(1, s.m // 2)}), "block_n": sorted({s.n, max(1, s.n // 2)}),
                 "block_k": sorted({s.k, max(1, s.k // 2)})}
        return TemplateSpace(defaults={"block_m": s.m, "block_n": s.n, "block_k": s.k}, space=space)

    def render(self, task: "Task", params: dict[str, Any], sizes: tuple[str, ...]) -> str:
        names = arg_names(task)
        bm, bn, bk = (int(params[p]) for p in ("block_m", "block_n", "block_k"))
        parts = [f'"""{task.id}: {self.description}.\n\nShapes are read from the arguments; tiles of BLOCK_M x BLOCK_N '
                 "(the last ones may be partial), BLOCK_K of the contraction a step. Generated by MaxKernel's "
                 'rules brain.\n"""\n', HEADER,
                 f"BLOCK_M = {bm}  # output rows per tile; a partial last tile is padded on read and cut on write",
                 f"BLOCK_N = {bn}  # output columns per tile (likewise)",
                 f"BLOCK_K = {bk}  # the contraction per step when it divides K, else all of K (no padding is summed)",
                 ""]
        programs = {}
        for size in sizes:
            program = trace_program(task, size).dce()
            found = match(program)
            if isinstance(found, str):
                raise EmitError(found)
            programs[size] = (found, [v.name for v in program.inputs], tuple(v.shape for v in program.inputs))
        statics = used_statics(next(iter(programs.values()))[0].epilogue)
        generic = {size: _render_generic(s, "", params) for size, (s, params, _) in programs.items()}
        if len(set(generic.values())) == 1:  # every size emits the same code: one function serves them all
            parts.append(next(iter(generic.values())))
            parts.append(size_dispatch({"any": ("_matmul", ())}, names, statics=statics) + "\n")
            return "\n".join(parts)
        parts.extend(_render_generic(s, f"_{size}", params) for size, (s, params, _) in programs.items())
        parts.append(size_dispatch({size: (f"_matmul_{size}", shapes) for size, (_, _, shapes) in programs.items()},
                                   names, statics=statics) + "\n")
        return "\n".join(parts)


def _precision(dot: Node) -> str:
    from maxkernel.rewrites.emit import _precision as text

    return text(dot.params.get("precision"))


def _render_generic(s: MatmulShape, suffix: str, params: list[str]) -> str:
    """The tiled kernel for any [M, K] x [K, N] (``suffix`` names a per-size copy): the epilogue, emitted at
    the traced shape, reads its shapes from its operands, so it runs on a tile as on the whole product."""
    statics = used_statics(s.epilogue)  # taken by _matmul and passed on to the epilogue
    lines = [emit_function(s.epilogue, f"_epilogue{suffix}", "The reference's epilogue, on one tile of the product.",
                            statics=True), ""]
    extra_refs = [f"{v.name}_ref" for v, _ in s.extras]
    extra_loads = [f"{v.name}_ref[...].reshape((-1,))" if kind == "bias" else f"{v.name}_ref[...]" for v, kind in s.extras]
    dn = "(((1,), (1,)), ((), ()))" if s.w_nk else "(((1,), (0,)), ((), ()))"
    out_dtype = dtype_expr(np.dtype(s.epilogue.outputs[0].dtype))
    lines += [
        f"def _kernel{suffix}(x_ref, w_ref, {''.join(r + ', ' for r in extra_refs)}o_ref, acc_ref{keyword_only(statics)}):",
        "    k = pl.program_id(2)",
        "",
        "    @pl.when(k == 0)",
        "    def _init():",
        "        acc_ref[...] = jnp.zeros_like(acc_ref)",
        "",
        f"    acc_ref[...] += jax.lax.dot_general(x_ref[...], w_ref[...], {dn}, precision={_precision(s.dot)}, "
        "preferred_element_type=jnp.float32)",
        "",
        "    @pl.when(k == pl.num_programs(2) - 1)",
        "    def _store():",
        f"        acc = acc_ref[...].astype({dtype_expr(s.dot.out.dtype)})",
        f"        o_ref[...] = _epilogue{suffix}({', '.join(['acc'] + extra_loads)}{passed_on(statics)}).astype(o_ref.dtype)",
        "",
        "",
    ]
    w_spec = ("pl.BlockSpec((bn, bk), lambda i, j, kk: (j, kk))" if s.w_nk
              else "pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))")
    specs = ["pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk))", w_spec]
    operands = [s.x.name, s.w.name]
    for v, kind in s.extras:
        if kind == "bias":
            specs.append("pl.BlockSpec((1, bn), lambda i, j, kk: (0, j))")
            operands.append(f"{v.name}.reshape((1, cols))")
        else:
            specs.append("pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j))")
            operands.append(v.name)
    n_axis = 0 if s.w_nk else 1
    lines += [
        f"def _matmul{suffix}({', '.join(params)}{keyword_only(statics)}):",
        f"    rows, depth = {s.x.name}.shape",
        f"    cols = {s.w.name}.shape[{n_axis}]",
        "    bm, bn = min(BLOCK_M, rows), min(BLOCK_N, cols)",
        "    bk = BLOCK_K if depth % BLOCK_K == 0 else depth",
        "    return pl.pallas_call(",
        f"        functools.partial(_kernel{suffix}{passed_on(statics)})," if statics else f"        _kernel{suffix},",
        f"        out_shape=jax.ShapeDtypeStruct((rows, cols), {out_dtype}),",
        "        grid=(pl.cdiv(rows, bm), pl.cdiv(cols, bn), depth // bk),",
        "        in_specs=[" + ", ".join(specs) + "],",
        "        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),",
        "        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],",
        f"    )({', '.join(operands)})",
    ]
    return "\n".join(lines) + "\n"


MATMUL = MatmulTemplate()
