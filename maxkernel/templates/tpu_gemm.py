"""TPU GEMM: the reference's one matmul on the MXU, with whatever follows it fused.

What an expert writes for ``epilogue(x @ w)`` on a TPU:
- a (M tiles, N tiles, K tiles) grid, K innermost, accumulating in an f32 VMEM tile; the weight is read in
  its stored layout ([N, K] is contracted on its dim 1, no transpose in HBM), and so is x (stored [K, M], it
  is read as [K, M] blocks and contracted on its dim 0);
- MXU operands in bf16 with f32 accumulation (``preferred_element_type``). bf16 inputs go in as they are.
  f32 inputs multiplied at full precision are either split into bf16 high and low parts and multiplied in
  three passes (``hi·hi + hi·lo + lo·hi``, the scheme XLA calls BF16_BF16_F32_X3: half the MXU passes of
  ``Precision.HIGHEST``, about 16 mantissa bits kept) or run at ``HIGHEST``; both are in the tuning space,
  three passes are the default, and a three-pass kernel the evaluator finds `incorrect` near the task's
  tolerance is retried at ``HIGHEST`` by the rules debugger (``retry_precise``);
- an elementwise epilogue (bias, scale, activations, residual tiles) runs on the accumulator on the last
  K step and the tile is written once; an epilogue that reduces along the row (softmax, logsumexp, sums,
  group norms, pooling over features) runs in a second kernel over blocks of whole rows of the product;
- ``dimension_semantics``: M and N tiles are parallel, K carries the accumulator.
Every shape is read from the arguments, block sizes are the named constants ``BLOCK_M``, ``BLOCK_N``,
``BLOCK_K`` and ``BLOCK_ROWS`` (the whole extent when it is smaller). Rows and columns of the product are
independent, so an M, N or row count they do not divide ends in a partial block (Pallas pads its reads and
drops its writes past the end); ``BLOCK_K`` is halved until it divides K (padding is never summed). One
body serves every size, with the steps of the tuned blocks. The
epilogue is the reference's own, written out as JAX with its shapes read from its operands.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from maxkernel.analysis.graph import ELEMENTWISE
from maxkernel.analysis.program import Node, Program, Var, arg_names, probe_sizes, static_args, trace_program
from maxkernel.analysis.statics import bind, used_statics
from maxkernel.rewrites.activations import cheaper_activations
from maxkernel.rewrites.emit import EmitError, dtype_expr, emit_function, emittable
from maxkernel.templates.gemm_prologue import Prologue, split_draws
from maxkernel.templates.base import FIT_SOURCE, NO_MOSAIC, TPU_VMEM_BUDGET, TemplateSpace, tpu_target

if TYPE_CHECKING:
    from jaxbench.report import EvalReport
    from jaxbench.task import Task
    from maxkernel.analysis import TaskAnalysis

HEADER = ("import functools\nimport math\n\nimport jax\nimport jax.numpy as jnp\nfrom jax.experimental import pallas as pl\n"
          "from jax.experimental.pallas import tpu as pltpu\n")
TPU_BLOCKS_M = (128, 256, 512, 1024)
TPU_BLOCKS_N = (256, 512, 1024, 2048)
TPU_BLOCKS_K = (256, 512, 1024, 2048)
TPU_BLOCK_ROWS = (8, 16, 32, 64, 128, 256, 512)
# VMEM a kernel that multiplies through ``_product`` may plan for, as a share of the chip's (the
# convolution's cap): blocks past the scoped default are worth it (fewer re-reads); the kernel raises its
# own limit to what it plans.
VMEM_SHARE = 0.4
# The GEMM's own share: K steps of 1024 beside 1024 x 2048 f32 tiles (60 MB with the split operands, a
# limit of 114 MB on a 128 MiB chip) halve the grid steps and the accumulator's updates of K steps of 512.
GEMM_VMEM_SHARE = 0.5
HIGHEST = "HIGHEST"
PASSES_F32 = (3, 6)  # bf16 passes per f32 product: the 3-pass split, or Precision.HIGHEST
W_NK_DIMENSIONS = "(((1,), (1,)), ((), ()))"
W_KN_DIMENSIONS = "(((1,), (0,)), ((), ()))"


def gemm_dimensions(x_km: bool, w_nk: bool) -> str:
    """The tile product's dimension numbers for x stored [M, K] or [K, M] and the weight [K, N] or [N, K]."""
    return f"((({0 if x_km else 1},), ({1 if w_nk else 0},)), ((), ()))"


ALL_DIMENSIONS = tuple(gemm_dimensions(a, b) for a in (False, True) for b in (True, False))
# The 3-pass product keeps about 16 mantissa bits, HIGHEST all 24: its error is about 2**8 times smaller.
# An `incorrect` 3-pass GEMM whose error is within this factor of the tolerance is retried at HIGHEST.
PRECISE_RETRY_FACTOR = 64.0


@dataclass
class GemmPlan:
    """One matmul of two inputs and the reference's computation after it."""

    m: int
    n: int
    k: int
    x: Var
    w: Var
    w_nk: bool  # the weight is stored [N, K] and contracted on its dim 1
    in_dtype: np.dtype
    precision: str  # the reference's dot precision, by name ("DEFAULT" when none)
    tail: Program  # inputs: the product ``h`` [M, N] then the other inputs it reads; outputs: the reference's
    tileable: bool  # the tail maps [M, N] tiles to tiles (elementwise, biases of [N], tiles of [M, N])
    row_blocked: tuple[bool, ...]  # per tail input after ``h``: shares the product's row axis
    epilogues: dict[tuple[int, ...], str] = field(default_factory=dict)  # extents -> emitted tail (): one for all
    placement: str = "tile"  # where the tail runs: "tile" (in the GEMM), "rows" (row-block kernel), "xla"
    rows_keyed: bool = True  # an XLA tail's constants may follow the row count (else only the row width does)
    prologue: Prologue | None = None  # the tail's random draws, made in XLA before the kernels
    prologue_text: str = ""  # its emitted ``_prologue``
    x_km: bool = False  # x is stored [K, M] and contracted on its dim 0 (activations kept transposed)

    @property
    def out(self) -> Var:
        out = self.tail.outputs[0]
        assert isinstance(out, Var)
        return out


def match(program: Program) -> GemmPlan | str:
    """The GEMM-then-tail structure of ``program``, or why it has none."""
    dots = [n for n in program.nodes if n.prim == "dot_general"]
    if len(dots) != 1:
        return f"{len(dots)} matmuls (the template computes exactly one)"
    dot = dots[0]
    (lc, rc), (lb, rb) = dot.params["dimension_numbers"]
    lhs, rhs = dot.ins
    producers = program.producers()
    upstream = {id(dot)}

    def _stored(v: Any, axis: int) -> tuple[Var, int, Node | None] | None:
        """The 2-D input an operand is read from, the axis of it contracted, and the transpose between."""
        if v in program.inputs and len(v.shape) == 2:
            return v, axis, None
        src = producers.get(v) if isinstance(v, Var) else None
        if (src is not None and src.prim == "transpose" and src.ins[0] in program.inputs
                and tuple(src.params["permutation"]) == (1, 0)):
            return src.ins[0], 1 - axis, src
        return None

    if lb or rb or len(getattr(lhs, "shape", ())) != 2 or tuple(lc) not in ((0,), (1,)) or tuple(rc) not in ((0,), (1,)):
        return "not a plain [M, K] matmul of an input"
    found_x, found_w = _stored(lhs, int(lc[0])), _stored(rhs, int(rc[0]))
    if found_x is None:
        return "not a plain [M, K] matmul of an input (or of its transpose)"
    if found_w is None:
        return "the weight is not a 2-D input (or its transpose)"
    (x, x_axis, x_t), (w, w_axis, w_t) = found_x, found_w
    x_km, w_nk = x_axis == 0, w_axis == 1  # x stored [K, M]; the weight stored [N, K]
    upstream.update(id(t) for t in (x_t, w_t) if t is not None)
    assert isinstance(w, Var) and isinstance(x, Var)
    if np.dtype(x.dtype) != np.dtype(w.dtype) or np.dtype(x.dtype) not in (np.dtype("float32"), np.dtype("bfloat16")):
        return "operands that are not both float32 or both bfloat16"
    m, n = dot.out.shape
    k = lhs.shape[lc[0]]
    nodes = [nd for nd in program.nodes if id(nd) not in upstream]
    if any(v in (x, w) for nd in nodes for v in nd.ins):
        return "the computation after the matmul reads x or the weight again"
    if len(program.outputs) != 1 or not isinstance(program.outputs[0], Var):
        return "the output is not one array"
    h = Var("h", (m, n), dot.out.dtype)
    others = [v for v in program.inputs if v is not x and v is not w and any(v in nd.ins for nd in nodes)]
    tail = Program([h] + others, [Node(nd.primitive, list(nd.ins), list(nd.outs), dict(nd.params)) for nd in nodes],
                   list(program.outputs), program.out_tree)
    tail.substitute(dot.out, h)
    cheaper_activations(tail)  # erfc (exact GELU) has no Mosaic lowering; 1 - erf has
    tail.dce()
    prologue = split_draws(tail)  # dropout's draws: made whole in XLA, read by the kernels as blocks
    others = tail.inputs[1:]
    tileable = program.outputs[0].shape == (m, n) and all(
        nd.prim in ELEMENTWISE or nd.prim == "broadcast_in_dim" for nd in tail.nodes) and all(
        v.shape in ((n,), (m, n)) for v in others)
    precision = dot.params.get("precision")
    levels = precision if isinstance(precision, (tuple, list)) else (precision,)
    names = {str(getattr(p, "name", p)).upper() for p in levels if p is not None}
    return GemmPlan(m, n, k, x, w, w_nk, np.dtype(x.dtype), HIGHEST if HIGHEST in names else "DEFAULT", tail,
                    tileable, tuple(bool(v.shape) and v.shape[0] == m and v.shape != (n,) for v in others),
                    prologue=prologue, x_km=x_km)


def gemm_vmem_bytes(p: GemmPlan, bm: int, bn: int, bk: int, passes: int) -> int:
    """VMEM one GEMM step plans for: double-buffered x, weight and output blocks (and epilogue tiles), the
    f32 accumulator, and the bf16 halves of both operand blocks when they are split."""
    item = p.in_dtype.itemsize
    out_item = np.dtype(p.out.dtype).itemsize if p.tileable else 4
    extras = sum(bn * 4 if v.shape == (p.n,) else bm * bn * 4 for v in p.tail.inputs[1:]) if p.tileable else 0
    blocks = 2 * ((bm * bk + bk * bn) * item + bm * bn * out_item + extras)
    split = 2 * 2 * (bm * bk + bk * bn) if passes == 3 else 0  # hi and lo, bf16
    return blocks + bm * bn * 4 + split


def rows_vmem_bytes(p: GemmPlan, rows: int) -> int:
    """VMEM one row-block step plans for: double-buffered rows of the product, of the row-blocked inputs
    and of the output, plus the inputs read whole."""
    per_row = p.n * 4 + int(np.prod(p.out.shape[1:], dtype=np.int64)) * np.dtype(p.out.dtype).itemsize
    whole = 0
    for v, blocked in zip(p.tail.inputs[1:], p.row_blocked):
        nbytes = int(np.prod(v.shape, dtype=np.int64)) * np.dtype(v.dtype).itemsize
        if blocked:
            per_row += nbytes // p.m
        else:
            whole += nbytes
    return 2 * (rows * per_row + whole)


def _passes(p: Any, task: "Task | None" = None) -> list[int]:
    """The MXU pass counts a plan's products may use, the fewest first. With the task: the fewest that meet
    its tolerance against the exact result (``maxkernel.analysis.precision``), whatever precision the
    reference wrote; without it, the reference's own precision (1 pass, or 3 and 6 at ``HIGHEST``)."""
    if p.in_dtype == np.dtype("bfloat16"):
        return [1]
    if task is not None:
        from maxkernel.analysis.precision import admitted_passes, precision_need

        return admitted_passes(precision_need(task))
    return list(PASSES_F32) if p.precision == HIGHEST else [1]


def chosen_passes(p: Any, params: dict[str, Any], task: "Task | None" = None) -> int:
    """The MXU passes asked for in ``params``, refused when the plan's dtype and the task's tolerance (or,
    without the task, the reference's precision) do not admit them (one rule for every template that
    multiplies through ``_mxu_source``)."""
    passes = int(params.get("passes", 1))
    if passes not in _passes(p, task):
        raise EmitError(f"{passes} MXU passes for {p.in_dtype} operands at precision {p.precision}")
    return passes


def _vmem_cap(target: str, share: float = VMEM_SHARE) -> int:
    from maxkernel.targets.specs import load_tpu_specs

    spec = load_tpu_specs()[target.removeprefix("tpu-")]
    return int(spec.vmem_bytes * share)


class TpuGemmTemplate:
    name = "tpu_gemm"
    description = ("GEMM on the MXU in bf16 passes with f32 accumulation, the reference's epilogue fused "
                   "(elementwise) or run over blocks of whole rows (row reductions)")

    def applies(self, task: "Task", analysis: "TaskAnalysis") -> str | None:
        found = plan(task, ("cpu", "full"))  # the full size too: one emitted epilogue must serve both
        if isinstance(found, str):
            return found
        return summed_product(task)

    def space(self, task: "Task", analysis: "TaskAnalysis", target: str) -> TemplateSpace:
        if not tpu_target(target):
            return TemplateSpace(defaults={}, space={"block_m": []})  # a TPU kernel: Mosaic-only operations
        p = plan(task, ("full",))
        assert not isinstance(p, str)
        cap = _vmem_cap(target, GEMM_VMEM_SHARE)
        admitted = _passes(p, task)
        worst = min(admitted)  # the split operands of the 3-pass product need the most VMEM
        fits = [(bm, bn, bk) for bm in TPU_BLOCKS_M for bn in TPU_BLOCKS_N for bk in TPU_BLOCKS_K
                if p.m % bm == 0 and p.n % bn == 0 and p.k % bk == 0 and gemm_vmem_bytes(p, bm, bn, bk, worst) <= cap]
        # An int8 block (a drawn mask) tiles by 32 rows.
        tile = 32 if any(np.dtype(v.dtype).itemsize == 1 for v in p.tail.inputs[1:]) else 8
        rows = [r for r in TPU_BLOCK_ROWS
                if p.m % r == 0 and r % tile == 0 and rows_vmem_bytes(p, r) <= TPU_VMEM_BUDGET]
        if not fits or (p.placement == "rows" and not rows):
            return TemplateSpace(defaults={"block_m": 0}, space={"block_m": []})
        # Largest tiles first (fewest re-reads of x and the weight), then the deepest K step.
        bm, bn, bk = max(fits, key=lambda t: (t[0] * t[1], t[2]))
        legal = set(fits)
        # Around it, the halves of each tile side: VMEM only shrinks with a block, so every combination of
        # the space (it is a product) fits. The model orders them when the tuner prices the space.
        space: dict[str, list[Any]] = {
            "block_m": sorted({bm} | ({bm // 2} if (bm // 2, bn, bk) in legal else set())),
            "block_n": sorted({bn} | ({bn // 2} if (bm, bn // 2, bk) in legal else set())),
            "block_k": [bk],
            "passes": admitted,
        }
        defaults: dict[str, Any] = {"block_m": bm, "block_n": bn, "block_k": bk, "passes": min(admitted)}
        if p.placement == "rows":
            defaults["block_rows"] = rows[-1]
            space["block_rows"] = rows[-2:]
        return TemplateSpace(defaults=defaults, space=space)

    def render(self, task: "Task", params: dict[str, Any], sizes: tuple[str, ...]) -> str:
        p = plan(task, sizes)
        if isinstance(p, str):
            raise EmitError(p)
        passes = chosen_passes(p, params, task)
        names = arg_names(task)
        doc = (f'"""{task.id}: {self.description}.\n\nGenerated by MaxKernel\'s rules brain: '
               f"blocks {params['block_m']}x{params['block_n']}x{params['block_k']}, {passes} MXU pass"
               f"{'es' if passes > 1 else ''} per product"
               + {"tile": "", "rows": f", {params.get('block_rows')} rows a step for the row epilogue",
                  "xla": ", the epilogue (it couples rows) left to XLA"}[p.placement] + '.\n"""\n')
        parts = [doc, HEADER, _constants(params, p.placement), FIT_SOURCE, "",
                 _mxu_source(gemm_dimensions(p.x_km, p.w_nk), passes),
                 _epilogue_source(p) + (p.prologue_text + "\n\n" if p.prologue else ""), _gemm_source(p)]
        if p.placement == "rows":
            parts.append(_rows_source(p))
        parts.append(_kernel_source(p, names, _size_statics(static_args(task, sizes[0]))))
        return "\n".join(parts)


def summed_product(task: "Task") -> str | None:
    """Why the GEMM should not be computed at all, or None: when the reference only sums the product over
    its columns, pre-summing the weight (``rewrite:sum_after_matmul``) leaves a matrix-vector product,
    bound by reading the weight once, N times less MXU work than any GEMM (21k, 23k)."""
    from maxkernel.rewrites import apply_rewrites

    if apply_rewrites(trace_program(task, "cpu"), ["sum_after_matmul"]).sites:
        return "the product is only summed over its columns: a matvec with pre-summed weights (rewrite:sum_after_matmul)"
    return None


def precise_source(source: str) -> str | None:
    """A rendered 3-pass GEMM with its tile product at ``Precision.HIGHEST`` instead (all else the same), or
    None when ``source`` has no 3-pass product of this template."""
    for dn in ALL_DIMENSIONS:
        split = _mxu_source(dn, 3)
        if split in source:
            return (source.replace(split, _mxu_source(dn, 6))
                    .replace(", 3 MXU passes per product", ", 6 MXU passes per product", 1))
    return None


def split_source(source: str) -> str | None:
    """A rendered kernel's one-pass tile products (``_mxu_source``) as three-pass ones instead (all else the
    same), or None when ``source`` has none."""
    out, first = source, True
    for dn in ALL_DIMENSIONS:
        for name in sorted(set(_PRODUCT_NAME.findall(source))):
            one = _mxu_source(dn, 1, name)
            if one in out:
                out = out.replace(one, _mxu_source(dn, 3, name, split=first and SPLIT_SOURCE not in out))
                first = False
    if out == source:
        return None
    return out.replace(" 1 MXU pass per product", " 3 MXU passes per product", 1)


def retry_split(source: str, report: "EvalReport") -> str | None:
    """The three-pass variant of an `incorrect` one-pass kernel that the evaluator found wrong only at the MXU
    precision it asked for (exact float32 matmuls pass: its reason says so), else None. One pass is chosen
    when the reference at one pass meets the tolerance with room (``maxkernel.analysis.precision``); a kernel
    checked at a larger size or on other draws may still land outside it, and this is its way back."""
    if report.status != "incorrect" or "incorrect under TPU matmul precision" not in report.reason:
        return None
    return split_source(source)


def retry_precise(source: str, report: "EvalReport") -> str | None:
    """The HIGHEST variant of an `incorrect` 3-pass GEMM whose error is near the task's tolerance (the 3-pass
    split is what made it miss), else None. The template's default is the 3-pass product (half the MXU
    passes); whether the tolerance admits it is known only once the evaluator has compared outputs, so this
    is where the choice is made."""
    from jaxbench.task import load_task

    if report.status != "incorrect" or report.max_abs_err is None:
        return None
    try:
        tolerance = load_task(report.task).spec.tolerance
    except Exception:  # a task this checkout does not know: no tolerance to judge by
        return None
    if report.max_abs_err > PRECISE_RETRY_FACTOR * tolerance.atol:
        return None  # far off: a wrong kernel, not a rounding one
    return precise_source(source)


def plan(task: "Task", sizes: tuple[str, ...]) -> GemmPlan | str:
    """The plan at every size. The epilogue is emitted once when it reads every size from its operands;
    else once per extent that its constants follow (the row width, and the rows too when XLA runs it on
    the whole product and a redrawn batch changes its text: a mean over the batch divides by the batch)."""
    found: list[GemmPlan] = []
    texts: dict[tuple[int, ...], str] = {}
    prologues: set[str] = set()
    rows_keyed = _rows_keyed(task, sizes[0])
    for size in sizes:
        p = match(trace_program(task, size).dce())
        if isinstance(p, str):
            return p
        reason = emittable(p.tail)
        if reason is not None:
            return reason
        p.placement = placement(task, p)
        p.rows_keyed = rows_keyed
        key = _extents(p, static_args(task, size))
        text = emit_function(p.tail, _epilogue_name(key), f"The reference after its matmul, for {_extent(key)}.",
                             statics=True)
        if texts.setdefault(key, text) != text:
            return "the computation after the matmul is written differently for the same extents"
        if p.prologue is not None:
            reason = emittable(p.prologue.program)
            if reason is not None:
                return reason
            p.prologue_text = emit_function(p.prologue.program, "_prologue",
                                            "The reference's random draws, over the whole product.", statics=True)
            prologues.add(p.prologue_text)
        found.append(p)
    if len(prologues) > 1:
        return "the random draws after the matmul are written differently at different sizes"
    if rows_keyed and found[-1].placement == "xla" and probe_sizes(task, sizes[0]):
        return ("the computation after the matmul is written for each row count (its text follows the batch), "
                "so it could not run at a batch it was not written for")
    if len({(p.x_km, p.w_nk, p.in_dtype, p.precision, p.placement, p.row_blocked) for p in found}) != 1:
        return "a matmul laid out differently at different sizes"
    generic = {text.replace(_epilogue_name(key), "_epilogue").replace(f", for {_extent(key)}.", ".")
               for key, text in texts.items()}
    if len(generic) == 1:
        found[-1].epilogues = {(): generic.pop()}
        return found[-1]
    last = found[-1]

    def text_at(task_at: "Task", size: str) -> tuple[tuple[int, ...], str] | None:
        p = match(trace_program(task_at, size).dce())
        if isinstance(p, str) or emittable(p.tail) is not None:
            return None
        p.placement, p.rows_keyed = last.placement, last.rows_keyed
        key = _extents(p, static_args(task_at, size))
        return key, emit_function(p.tail, _epilogue_name(key), f"The reference after its matmul, for {_extent(key)}.",
                                  statics=True)

    last.epilogues = ladder_epilogues(task, texts, text_at)
    return last


def ladder_epilogues(task: "Task", texts: dict[tuple[int, ...], str],
                     text_at: Callable[["Task", str], tuple[tuple[int, ...], str] | None]) -> dict[tuple[int, ...], str]:
    """Epilogues written per extents, with those of the check ladder's sizes added. A static that follows a
    size (a batch count that reshapes the product) keys the epilogue by it; without the ladder's functions
    no check size below ``full`` would run the code priced at ``full``. A size whose trace does not match, or
    that writes another text for extents already written, adds nothing."""
    from maxkernel.targets.check_size import at_ladder

    every = dict(texts)
    for key, text in at_ladder(task, text_at).values():
        every.setdefault(key, text)
    return every


def _rows_keyed(task: "Task", size: str) -> bool:
    """Whether an XLA tail's text follows the row count: it is emitted at ``size`` and at ``size`` with the
    task's free sizes redrawn (the batch a model calls it with), and compared. Different text (a mean over
    the batch divides by it) keys the tail by its rows too; the same text serves any row count."""
    probes = probe_sizes(task, size)
    if not probes:
        return True
    texts = []
    for task_at, at in ((task, size), probes[0]):
        p = match(trace_program(task_at, at).dce())
        if isinstance(p, str) or emittable(p.tail) is not None:
            return True
        texts.append(emit_function(p.tail, "_epilogue", statics=True))
    return texts[0] != texts[1]


def _size_statics(static: dict[str, Any]) -> list[str]:
    """The static arguments that are sizes (integers): the epilogue's reshapes and constants may follow them."""
    return sorted(k for k, v in static.items() if isinstance(v, int) and not isinstance(v, bool))


def _extents(p: GemmPlan, static: dict[str, Any]) -> tuple[int, ...]:
    """What the epilogue's constants may follow: the row width (and the rows, when XLA runs it on the whole
    product), then every integer static argument (a group count)."""
    return ((p.m, p.n) if p.placement == "xla" and p.rows_keyed else (p.n,)) + tuple(int(static[k]) for k in _size_statics(static))


def _epilogue_name(key: tuple[int, ...]) -> str:
    return "_epilogue_" + "x".join(str(d) for d in key)


def _extent(key: tuple[int, ...]) -> str:
    return "extents " + " x ".join(str(d) for d in key)


def _epilogue_source(p: GemmPlan) -> str:
    """The emitted tail, and ``_epilogue_for(extents)``, the lookup the kernel uses."""
    if () in p.epilogues:
        return p.epilogues[()] + "\n\n\ndef _epilogue_for(extents):\n    return _epilogue\n\n"
    checks = "".join(f"    if extents == {key}:\n        return {_epilogue_name(key)}\n" for key in sorted(p.epilogues))
    return "\n\n".join(p.epilogues[key] for key in sorted(p.epilogues)) + f'''


def _epilogue_for(extents):
    """Constants of the epilogue follow the product's extents: the function written for these."""
{checks}    raise ValueError(f"the epilogue is written for extents {sorted(p.epilogues)} only, not {{extents}}")

'''


def placement(task: "Task", p: GemmPlan) -> str:
    """Where the tail runs: on GEMM tiles when it is elementwise; over whole rows when each output row
    depends on its own row of the product only (checked on values at the cpu size); else XLA runs it on
    the product (statistics over the batch, a reduction across rows)."""
    from maxkernel.analysis.rows import row_layout

    if p.tileable:
        return "tile"
    if any(n.prim.startswith("random") for n in p.tail.nodes):
        return "xla"  # random bits drawn per block would not be the reference's draws over the whole product
    if any(n.prim in NO_MOSAIC for n in p.tail.nodes):
        return "xla"  # a top-k, a sort, a gather after the matmul: no kernel holds them
    out = p.out
    rows = row_layout(task, "cpu")
    if rows is not None and rows.independent and rows.row_dims == 1 and out.shape and out.shape[0] == p.m:
        return "rows"
    return "xla"


def _constants(params: dict[str, Any], placement: str) -> str:
    lines = [f"BLOCK_M = {int(params['block_m'])}  # rows of x per tile",
             f"BLOCK_N = {int(params['block_n'])}  # output columns per tile",
             f"BLOCK_K = {int(params['block_k'])}  # contraction per step (innermost, accumulated)"]
    if placement == "rows":
        lines.append(f"BLOCK_ROWS = {int(params['block_rows'])}  # whole rows of the product per epilogue step")
    return "\n".join(lines) + "\n"


SPLIT_SOURCE = '''def _split(a):
    """``a`` as a high and a low bf16 part: ``hi + lo`` keeps about 16 of f32's 24 mantissa bits."""
    hi = a.astype(jnp.bfloat16)
    return hi, (a - hi.astype(jnp.float32)).astype(jnp.bfloat16)
'''


_PRODUCT_NAME = re.compile(r"^def (\w+)\(x, w\):$", re.M)


def _mxu_source(dn: str, passes: int, name: str = "_product", split: bool = True) -> str:
    """The tile product ``name(x, w)`` for ``passes`` bf16 MXU passes, contracting as ``dn`` says; ``split``:
    also emit the ``_split`` helper of the 3-pass product (once per module when it has several products)."""
    if passes == 3:
        return (SPLIT_SOURCE + "\n\n" if split else "") + f'''def {name}(x, w):
    """One f32 tile product in three bf16 MXU passes (the lo x lo term is below f32 rounding here)."""
    x_hi, x_lo = _split(x)
    w_hi, w_lo = _split(w)
    dot = functools.partial(jax.lax.dot_general, dimension_numbers={dn}, preferred_element_type=jnp.float32)
    return dot(x_hi, w_hi) + (dot(x_hi, w_lo) + dot(x_lo, w_hi))

'''
    if passes == 6:
        return f'''def {name}(x, w):
    """One tile product: f32 operands at full precision (six bf16 passes)."""
    return jax.lax.dot_general(x, w, {dn}, preferred_element_type=jnp.float32, precision=jax.lax.Precision.HIGHEST)

'''
    return f'''def {name}(x, w):
    """One tile product in one MXU pass, accumulated in f32: float32 operands are rounded to bf16 first, as a
    default-precision product on a TPU rounds them (fed as float32 the MXU takes them at a slower rate)."""
    x, w = (v.astype(jnp.bfloat16) if v.dtype == jnp.float32 else v for v in (x, w))
    return jax.lax.dot_general(x, w, {dn}, preferred_element_type=jnp.float32)

'''


def _prologue_call(p: GemmPlan) -> list[str]:
    """The kernel's line that makes the tail's draws in XLA (none when it draws nothing)."""
    if p.prologue is None:
        return []
    h_dtype = dtype_expr(np.dtype(p.tail.inputs[0].dtype))
    names = "".join(f"{v.name}, " for v in p.prologue.outputs)
    reads = "".join(f", {v.name}" for v in p.prologue.program.inputs[1:])
    used = used_statics(p.prologue.program)
    reads += f", {bind(used)}" if used else ""
    return ["    # The tail's random draws, made over the whole product as the reference makes them.",
            f"    {names}= _prologue(jax.ShapeDtypeStruct((m, n), {h_dtype}){reads})"]


def _gemm_source(p: GemmPlan) -> str:
    extras = [v.name for v in p.tail.inputs[1:]] if p.tileable else []
    refs = "".join(f"{name}_ref, " for name in extras)
    h_dtype = dtype_expr(np.dtype(p.tail.inputs[0].dtype))
    if p.tileable:
        loads = ", ".join(["acc_ref[...].astype(" + h_dtype + ")"]
                          + [f"{name}_ref[...].reshape(({name}_ref.shape[1],))" if v.shape == (p.n,) else f"{name}_ref[...]"
                             for name, v in zip(extras, p.tail.inputs[1:])])
        store = f"o_ref[...] = epilogue({loads}).astype(o_ref.dtype)"
        doc = "x @ w over K steps into an f32 tile; the reference's epilogue on the last step, one write."
    else:
        store = f"o_ref[...] = acc_ref[...].astype(o_ref.dtype)"
        doc = "x @ w over K steps into an f32 tile, written once on the last step."
    return f'''def _gemm_kernel(x_ref, w_ref, {refs}o_ref, acc_ref, *, epilogue):
    """{doc}"""
    k = pl.program_id(2)

    @pl.when(k == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += _product(x_ref[...], w_ref[...])

    @pl.when(k == pl.num_programs(2) - 1)
    def _store():
        {store}

'''


def _rows_source(p: GemmPlan) -> str:
    refs = ", ".join(f"{v.name}_ref" for v in p.tail.inputs)
    loads = ", ".join(f"{v.name}_ref[...].reshape(shapes[{i}])" for i, v in enumerate(p.tail.inputs))
    return f'''def _rows_kernel({refs}, o_ref, *, epilogue, shapes):
    """The reference's epilogue on whole rows of the product (it reduces along them)."""
    o_ref[...] = epilogue({loads}).reshape(o_ref.shape).astype(o_ref.dtype)


def _rows_of(a):
    """A row-blocked input as a 2-D array: its row axis, then everything else."""
    return a.reshape((a.shape[0], -1))


def _whole(a):
    """An input read whole by every step, as a 2-D block (a vector travels as one row)."""
    return a.reshape((1, a.size)) if a.ndim < 2 else a.reshape((a.shape[0], -1))

'''


def _kernel_source(p: GemmPlan, names: list[str], statics: list[str]) -> str:
    x, w = p.x.name, p.w.name
    dims = ["m", "n"] if p.placement == "xla" and p.rows_keyed else ["n"]
    extents = "(" + ", ".join(dims + [f"static[{k!r}]" for k in statics]) + ("," if len(dims) + len(statics) == 1 else "") + ")"
    others = [v.name for v in p.tail.inputs[1:]]
    w_spec = ("pl.BlockSpec((block_n, block_k), lambda i, j, kk: (j, kk))" if p.w_nk
              else "pl.BlockSpec((block_k, block_n), lambda i, j, kk: (kk, j))")
    n_expr = f"{w}.shape[0]" if p.w_nk else f"{w}.shape[1]"
    h_dtype = dtype_expr(np.dtype(p.tail.inputs[0].dtype))
    out_dtype = dtype_expr(np.dtype(p.out.dtype))
    x_spec = ("pl.BlockSpec((block_k, block_m), lambda i, j, kk: (kk, i))" if p.x_km
              else "pl.BlockSpec((block_m, block_k), lambda i, j, kk: (i, kk))")
    in_specs = [x_spec, w_spec]
    operands = [x, w]
    if p.tileable:
        for name, v in zip(others, p.tail.inputs[1:]):
            if v.shape == (p.n,):
                in_specs.append("pl.BlockSpec((1, block_n), lambda i, j, kk: (0, j))")
                operands.append(f"{name}.reshape((1, n))")
            else:
                in_specs.append("pl.BlockSpec((block_m, block_n), lambda i, j, kk: (i, j))")
                operands.append(name)
    gemm_out = out_dtype if p.tileable else h_dtype
    item = p.in_dtype.itemsize
    lines = [
        f"def kernel({', '.join(names)}, **static):",
        f"    {'k, m' if p.x_km else 'm, k'} = {x}.shape",
        f"    n = {n_expr}",
        "    block_m, block_n, block_k = min(BLOCK_M, m), min(BLOCK_N, n), _fit(BLOCK_K, k)  # partial last M, N tiles",
        "    # What one step holds (blocks double-buffered, the f32 accumulator, split operands): the limit",
        "    # is raised to it, with headroom for Mosaic's own temporaries.",
        f"    planned = 2 * (block_m * block_k + block_k * block_n) * {item} + 2 * block_m * block_n * 4 * 2"
        " + 4 * (block_m * block_k + block_k * block_n) + block_m * block_n * 4",
        f"    epilogue = _epilogue_for({extents})",
        *([f"    epilogue = functools.partial(epilogue, {bind(used_statics(p.tail))})  # the statics it reads"]
          if used_statics(p.tail) else []),
        *_prologue_call(p),
        "    h = pl.pallas_call(",
        f"        functools.partial(_gemm_kernel, epilogue={'epilogue' if p.placement == 'tile' else 'None'}),",
        f"        out_shape=jax.ShapeDtypeStruct((m, n), {gemm_out}),",
        "        grid=(pl.cdiv(m, block_m), pl.cdiv(n, block_n), k // block_k),",
        "        in_specs=[" + ", ".join(in_specs) + "],",
        "        out_specs=pl.BlockSpec((block_m, block_n), lambda i, j, kk: (i, j)),",
        "        scratch_shapes=[pltpu.VMEM((block_m, block_n), jnp.float32)],",
        '        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary"),',
        "                                             vmem_limit_bytes=max(32 << 20, planned + (planned >> 1))),",
        f"    )({', '.join(operands)})",
    ]
    if p.placement == "tile":
        lines.append("    return h")
        return "\n".join(lines) + "\n"
    if p.placement == "xla":
        lines.append("    # The epilogue couples rows of the product (statistics over the batch): XLA runs it on h.")
        lines.append(f"    return epilogue(h{''.join(', ' + o for o in others)})")
        return "\n".join(lines) + "\n"
    row_specs = ["pl.BlockSpec((block_rows, n), lambda i: (i, 0))"]
    for name, blocked in zip(others, p.row_blocked):
        row_specs.append(f"pl.BlockSpec((block_rows, _rows_of({name}).shape[1]), lambda i: (i, 0))" if blocked
                         else f"pl.BlockSpec(_whole({name}).shape, lambda i: (0, 0))")
    shapes = ", ".join(["(block_rows, n)"] + [f"(block_rows,) + {name}.shape[1:]" if blocked else f"{name}.shape"
                                              for name, blocked in zip(others, p.row_blocked)])
    lines += [
        "    block_rows = min(BLOCK_ROWS, m)  # a partial last block: no row reads another",
        f"    out = jax.eval_shape(epilogue, h{''.join(', ' + o for o in others)})",
        "    cols = math.prod(out.shape[1:])",
        f"    body = functools.partial(_rows_kernel, epilogue=epilogue, shapes=({shapes},))",
        "    rows = pl.pallas_call(",
        "        body,",
        "        out_shape=jax.ShapeDtypeStruct((m, cols), out.dtype),",
        "        grid=(pl.cdiv(m, block_rows),),",
        "        in_specs=[" + ", ".join(row_specs) + "],",
        "        out_specs=pl.BlockSpec((block_rows, cols), lambda i: (i, 0)),",
        '        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),',
        f"    )(h{''.join((', _rows_of(' if b else ', _whole(') + o + ')' for o, b in zip(others, p.row_blocked))})",
        "    return rows.reshape(out.shape)",
    ]
    return "\n".join(lines) + "\n"


TPU_GEMM = TpuGemmTemplate()
