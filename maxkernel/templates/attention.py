"""Flash attention over a block schedule: only the key blocks the mask leaves visible are visited.

The reference's mask (causal, a sliding causal window, or a causal window with global blocks; see
``masks``) is recovered as a formula, and a logit soft cap (``cap * tanh(s / cap)`` after the scale, as
Gemma 2 writes it) is applied to the f32 scores before the mask. At trace time the candidate sorts every
(query block, key block) pair into empty, whole or partial and flattens the visible ones, row by row, into
scalar-prefetched step tables, as JAX's splash attention does (a sliding window's blocks wholly outside it
are never visited); the grid is (batch, kv head, step), so a skipped block costs neither a DMA nor a grid
step, and only partial blocks evaluate the mask, token by token.

What an expert writes, and why:
- MXU operands in the input dtype (bf16 in, f32 accumulate through ``preferred_element_type``): the f32
  rate is a sixth of bf16's. f32 inputs keep f32 operands at full precision.
- a query block holds every query head that shares one kv head, so each kv block is loaded once per group;
- the softmax scale multiplies the f32 scores, as JAX's flash attention does (a scaled bf16 copy of the
  query block would round every query: outside a bf16 task's tolerance on shifted inputs);
- masked scores take a large finite value (no ``inf - inf``), and the output is normalised once, after the
  row's last key block;
- ``dimension_semantics``: batch and kv heads are parallel, the step axis carries the accumulators.
The emitted code reads every shape from its arguments; block sizes are named constants (the whole sequence
when it is shorter), and a sequence they do not divide ends in a partial block: its padded query rows are
cut on write, and the step of a partial key block masks the keys past the end and zeroes their values (a
padded value row would reach the output through ``0 * value``), so the same body runs at every size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from maxkernel.analysis.program import Program, Var, arg_names, doubled_sizes, static_args, trace_program
from maxkernel.analysis.precision import kernel_passes
from maxkernel.rewrites.emit import EmitError, dtype_expr, emit_function, scalar_text
from maxkernel.rewrites.numeric import TooLargeToEvaluate
from maxkernel.templates.base import TPU_VMEM_BUDGET, TemplateSpace, divisors, tpu_target
from maxkernel.rewrites.sized import integer_statics
from maxkernel.templates.around import Around, around_source, around_with_passes
from maxkernel.templates.attention_joined import NOT_JOINED, Joined, find_joined, joined_program
from maxkernel.templates.attention_joined import wrapper_source as joined_wrapper
from maxkernel.templates.attention_layout import Layout, canonical_program, find_layout, wrapper_source
from maxkernel.templates.attention_tail import split_after_attention
from maxkernel.templates.bias import TILES_SOURCE, bias_tile_count, is_relative_bias
from maxkernel.templates.tpu_gemm import _mxu_source
from maxkernel.templates.masks import MaskFormula, recover

if TYPE_CHECKING:
    from jaxbench.task import Task
    from maxkernel.analysis import TaskAnalysis

TPU_BLOCKS_Q = (128, 256, 512, 1024)
TPU_BLOCKS_K = (128, 256, 512, 1024, 2048)


@dataclass
class AttentionShape:
    batch: int
    q_heads: int
    kv_heads: int
    seq_q: int
    seq_k: int
    head_dim: int
    scale: float
    in_dtype: Any
    out_dtype: Any
    mask: np.ndarray  # [seq_q, seq_k], True where a key is visible
    static: dict[str, Any]
    bias: str | None = None  # the relative-position bias table's argument name
    bias_structure: tuple[str, ...] = ()  # the primitives computing the bias from the table
    buckets: int = 0  # the bias table's last axis
    soft_cap: float | None = None  # scores pass through cap * tanh(s / cap) after the scale (Gemma 2)
    layout: Layout | None = None  # the reference's own argument order and axes, where they differ
    dense: tuple[int, ...] = ()  # a bias read whole: the score axes its axes are (e.g. heads, query, key)
    tail: Program | None = None  # elementwise ops from the attention's result to the output, run in XLA
    v_dim: int = 0  # the values' head dimension (0: head_dim)
    joined: Joined | None = None  # scores written as a sum of products of query and key parts
    around: Around | None = None  # the attention inside a larger computation: the code around its core
    core: Program | None = None  # then the core's own program (its operands as arguments)

    @property
    def group(self) -> int:
        return self.q_heads // self.kv_heads


def match(program: Program, static: dict[str, Any] | None = None, size_checked: bool = True,
          moved: bool = False) -> AttentionShape | str:
    """The attention this program computes, or why the flash template cannot compute it.

    A bias's values are checked only when ``size_checked`` (evaluating it builds [heads, seq, seq]).
    ``moved``: the program is the reference moved to ``[batch, heads, seq, head_dim]`` (``attention_layout``).
    """
    # Imported here: blocked_attention imports the template registry, which imports this module.
    from maxkernel.rewrites.blocked_attention import match_attention

    plan = match_attention(program, moved)
    if isinstance(plan, str):
        return plan
    if plan.pv_out is not None:
        return "no softmax over the scores (linear attention)"
    after = split_after_attention(program)
    if isinstance(after, str):
        return after
    result, tail = after
    if tail is not None and tuple(result.shape) != (*plan.q.shape[:3], plan.v.shape[3]):
        return "an elementwise tail after an attention result in another layout than [batch, heads, seq, dim]"
    extra = [v for v in program.inputs if v not in (plan.q, plan.k, plan.v)]
    if program.inputs[:3] != [plan.q, plan.k, plan.v] or len(extra) > 1:
        return "inputs other than q, k, v and one bias table"
    scale = plan.q_factor
    bias: str | None = None
    bias_structure: tuple[str, ...] = ()
    capped = _soft_cap(plan.steps)
    if isinstance(capped, str):
        return capped
    soft_cap, cap_steps = capped if capped is not None else (None, set())
    for index, step in enumerate(plan.steps):
        if index in cap_steps:
            continue
        if step.kind == "side" and step.prim == "add" and bias is None and extra:
            assert isinstance(step.operand, Var)
            if program.reads(step.operand) != {extra[0].name}:
                return "a score term that reads more than the bias table"
            dense = dense_bias_axes(program, step.operand, extra[0])
            if dense is None and size_checked and not is_relative_bias(program, step.operand, extra[0], plan.q.shape[2],
                                                                       plan.k.shape[2]):
                return ("a score bias that is neither an array over (heads,) query and key nor "
                        "table[head, clip(query - key, 0, buckets - 1)]")
            bias = extra[0].name
            bias_structure = tuple(n.prim for n in program.ancestors(step.operand))
        elif bias is not None and step.kind == "scalar":
            return "a scale applied after the bias"
        elif step.kind == "scalar" and step.prim in ("mul", "div") and step.scores_first:
            if cap_steps and index > min(cap_steps):
                return "a scale applied after the soft cap"
            value = float(step.operand.scalar())  # type: ignore[union-attr]
            scale = scale * value if step.prim == "mul" else scale / value
        elif step.kind == "mask":
            if cap_steps and index < min(cap_steps):
                return "a mask applied before the soft cap (tanh of a hidden score is not hidden)"
            pred = step.operand
            assert isinstance(pred, Var)
            if _differs_between_heads(program, pred, plan.score_shape):
                return "a mask that differs between heads"
        elif step.kind != "none":
            return f"a score term beyond a scale, a soft cap and a mask ({step.prim} with {step.kind} operand)"
    if soft_cap is not None and bias is not None:
        return "a soft cap and a score bias together"
    if extra and bias is None:
        return "an input that is not q, k, v or an additive score bias"
    q, k = plan.q, plan.k
    dense_axes = dense_bias_axes(program, next(st.operand for st in plan.steps if st.kind == "side"), extra[0]) \
        if bias is not None else None
    return AttentionShape(q.shape[0], q.shape[1], k.shape[1], q.shape[2], k.shape[2], q.shape[3], scale,
                          np.dtype(q.dtype), np.dtype(result.dtype), plan.mask, dict(static or {}), bias,
                          bias_structure, int(extra[0].shape[-1]) if bias is not None and dense_axes is None else 0,
                          soft_cap, dense=dense_axes or (), tail=tail, v_dim=int(plan.v.shape[3]))


def dense_bias_axes(program: Program, term: Any, table: Var) -> tuple[int, ...] | None:
    """The score axes (of batch, heads, query, key) that the bias input's axes are, when ``term`` is the
    input itself, cast and broadcast to the scores (an additive bias or mask read whole); else None."""
    producers = program.producers()
    axes: list[int] | None = None
    var = term
    while var is not table:
        node = producers.get(var) if isinstance(var, Var) else None
        if node is None:
            return None
        if node.prim == "convert_element_type":
            var = node.ins[0]
        elif node.prim == "broadcast_in_dim" and axes is None and len(node.out.shape) == 4:
            dims = [int(d) for d in node.params["broadcast_dimensions"]]
            operand = node.ins[0]
            if not isinstance(operand, Var) or any(int(operand.shape[i]) != int(node.out.shape[d]) for i, d in enumerate(dims)):
                return None
            axes = dims
            var = operand
        else:
            return None
    found = tuple(axes) if axes is not None else tuple(range(4)) if len(table.shape) == 4 else None
    if found is None or found[-2:] != (2, 3) or found not in ((2, 3), (1, 2, 3), (0, 1, 2, 3)):
        return None
    return found


def _soft_cap(steps: list[Any]) -> tuple[float, set[int]] | None | str:
    """Logit soft-capping, ``cap * tanh(s / cap)`` (Gemma 2): its cap and the indices of its three steps
    (the division by the cap, the tanh, the product by the cap); None when the scores have no tanh."""
    found = [i for i, step in enumerate(steps) if step.kind == "unary"]
    if not found:
        return None
    if len(found) > 1 or steps[found[0]].prim != "tanh":
        return "a score transform other than one soft cap (cap * tanh(s / cap))"
    at = found[0]
    before, after = (steps[at - 1] if at > 0 else None), (steps[at + 1] if at + 1 < len(steps) else None)
    if before is None or after is None or before.kind != "scalar" or after.kind != "scalar":
        return "a tanh of the scores that is not cap * tanh(s / cap)"
    inner = float(before.operand.scalar())
    inner = inner if before.prim == "div" and before.scores_first else 1.0 / inner if before.prim == "mul" else math.nan
    outer = float(after.operand.scalar()) if after.prim == "mul" else math.nan
    if not (math.isfinite(inner) and inner > 0 and np.float32(inner) == np.float32(outer)):
        return "a tanh of the scores that is not cap * tanh(s / cap) with one cap"
    return outer, {at - 1, at, at + 1}


def _differs_between_heads(program: Program, pred: Var, score_shape: tuple[int, ...]) -> bool:
    """Whether the (input-free) mask ``pred`` differs between any two [seq_q, seq_k] slices of the scores.

    XLA reduces it one slice at a time (``evaluate_any``), so a full-size causal mask built from [seq, seq]
    iotas is checked exactly without its int32 intermediates ever existing side by side in this process.
    """
    from maxkernel.rewrites.numeric import evaluate_any

    sq, sk = score_shape[-2:]
    lead = int(np.prod(score_shape[:-2]))

    def differs(value: Any) -> Any:
        import jax.numpy as jnp

        slices = jnp.broadcast_to(value, score_shape).reshape(lead, sq, sk)
        return slices != slices[:1]

    return bool(evaluate_any(program.ancestors(pred), pred, differs, lead).any())


# (task folder, source digest, size) -> the match (tracing and evaluating a full-size mask takes seconds)
_ANALYSED: dict[tuple[str, str, str], AttentionShape | str] = {}


def analyse(task: "Task", size: str) -> AttentionShape | str:
    key = (str(task.path), task.source_digest, size)
    if key not in _ANALYSED:
        # The bias is checked on values at the cpu size; larger sizes must trace to the same structure.
        try:
            _ANALYSED[key] = _analysed(task, size)
        except TooLargeToEvaluate as exc:  # a mask too large to evaluate here: decline, never crash the planner
            _ANALYSED[key] = f"mask not evaluated at {size}: {exc}"
    return _ANALYSED[key]


def _analysed(task: "Task", size: str) -> AttentionShape | str:
    """The match of the reference as written, else of the reference moved to ``[batch, heads, seq,
    head_dim]`` when its arguments are in another order or layout."""
    program = trace_program(task, size).dce()
    found = match(program, static_args(task, size), size_checked=size == "cpu")
    if not isinstance(found, str):
        return found
    layout = find_layout(program)
    if isinstance(layout, str):
        joined = _joined(program, static_args(task, size), size == "cpu", found)
        return joined if not isinstance(joined, str) else _cut(program, size == "cpu", joined)
    # in order and layout already, the keys may still be repeated over the heads: matched as moved
    target = program if layout.identity else canonical_program(task, size, layout).dce()
    moved = match(target, static_args(task, size), size_checked=size == "cpu", moved=True)
    if isinstance(moved, str):
        return f"{moved} (with the arguments read as [batch, heads, seq, head_dim])"
    moved.layout = None if layout.identity else layout
    return moved


def match_core(program: Program, size_checked: bool = False) -> AttentionShape | str:
    """The attention a cut-out core computes (its q, k, v in order, or its scores' parts); a bias's values
    checked only when ``size_checked``."""
    found = match(program, {}, size_checked=size_checked)
    return found if not isinstance(found, str) else _joined(program, {}, size_checked, found)


def _cut(program: Program, size_checked: bool, why: str) -> AttentionShape | str:
    """The attention core inside a larger computation (``attention_cut``), the code around it kept, else
    ``why`` the reference as written is not matched."""
    from maxkernel.templates.attention_cut import cut_attention

    cut = cut_attention(program)
    if isinstance(cut, str):
        return f"{why}; nor one attention core to cut: {cut}"
    core, around = cut
    found = match_core(core, size_checked)
    if isinstance(found, str):
        return f"{why}; its attention core: {found}"
    found.around, found.core = around, core
    return found


def _joined(program: Program, static: dict[str, Any], size_checked: bool, why: str) -> AttentionShape | str:
    """The match of scores written as a sum of products (``attention_joined``), else ``why`` the reference
    as written is not matched."""
    joined = find_joined(program)
    if isinstance(joined, str):
        return why if joined == NOT_JOINED else f"{why}; nor a sum of score products: {joined}"
    rewritten = joined_program(program, joined)
    if isinstance(rewritten, str):
        return f"{rewritten} (scores as a sum of products)"
    found = match(rewritten, static, size_checked=size_checked)
    if isinstance(found, str):
        return f"{found} (with the score's parts joined)"
    found.joined = joined
    return found


@dataclass
class FlashPlan:
    """What the emitted kernel needs beyond its block sizes, checked at every rendered size."""

    mask: MaskFormula | None
    scale_text: str
    in_dtype: Any
    out_dtype: Any
    static: tuple[str, ...]
    bias: str | None = None
    soft_cap: float | None = None
    layout: Layout | None = None
    dense: tuple[int, ...] = ()  # see AttentionShape.dense
    passes: int = 6  # bfloat16 MXU passes of a float32 product: 1 where the task's tolerance admits it
    tail: str | None = None  # the source of ``_tail``: what follows the attention, run in XLA on its result
    joined: Joined | None = None  # see AttentionShape.joined
    cut: bool = False  # the attention is the core of a larger computation (AttentionShape.around)


def plan(task: "Task", sizes: tuple[str, ...]) -> FlashPlan | str:
    shapes = [analyse(task, size) for size in sizes]
    failed = next((s for s in shapes if isinstance(s, str)), None)
    if failed is not None:
        return failed
    found = [s for s in shapes if not isinstance(s, str)]
    mask = recover([(s.mask, s.static) for s in found])
    if isinstance(mask, str):
        return mask
    if all(math.isclose(s.scale, 1.0 / math.sqrt(s.head_dim), rel_tol=1e-6) for s in found):
        scale_text = "1.0 / math.sqrt(head_dim)"
    elif all(math.isclose(s.scale, found[0].scale, rel_tol=1e-9) for s in found):
        scale_text = scalar_text(np.float64(found[0].scale))
    else:
        return "a softmax scale that changes with size but is not 1/sqrt(head_dim)"
    if len({(s.in_dtype, s.out_dtype) for s in found}) != 1:
        return "dtypes that change with size"
    if len({s.soft_cap for s in found}) != 1:
        return "a soft cap that changes with size"
    if found[0].bias is not None and ("cpu" not in sizes or len({s.bias_structure for s in found}) != 1):
        return "a bias whose values were not checked at the cpu size, or that is computed differently by size"
    if len({s.layout for s in found}) != 1 or len({s.dense for s in found}) != 1 or len({s.joined for s in found}) != 1 \
            or len({s.around is None for s in found}) != 1:
        return "arguments whose roles or axes change with size"
    tails = {None if s.tail is None else emit_function(s.tail, "_tail", TAIL_DOC, size_names=False) for s in found}
    if len(tails) != 1:
        return "an elementwise tail after the attention that changes with size"
    return FlashPlan(mask, scale_text, found[0].in_dtype, found[0].out_dtype, tuple(found[0].static), found[0].bias,
                     found[0].soft_cap, found[0].layout, found[0].dense,
                     kernel_passes(task) if np.dtype(found[0].in_dtype) == np.float32 else 6, tails.pop(),
                     found[0].joined, found[0].around is not None)


def vmem_bytes(a: AttentionShape, block_q: int, block_k: int) -> int:
    """VMEM one grid step plans for: double-buffered q, k, v and output blocks, the f32 accumulator and
    row statistics (lane-padded), and one head's f32 scores and probabilities."""
    item, out = a.in_dtype.itemsize, a.out_dtype.itemsize
    q_rows, v_dim = a.group * block_q, a.v_dim or a.head_dim
    blocks = 2 * (q_rows * (a.head_dim * item + v_dim * out) + block_k * (a.head_dim + v_dim) * item)
    scratch = q_rows * v_dim * 4 + 2 * q_rows * 128 * 4
    tiles = 0
    if a.dense:  # the bias block of each step, double-buffered, as float32 at most
        tiles = 2 * (a.group if 1 in a.dense else 1) * block_q * block_k * 4
    elif a.bias is not None:  # every distance's tile, double-buffered (see bias.TILES_SOURCE)
        tiles = 2 * a.group * (bias_tile_count(a.buckets, block_q) * block_q * block_k * item)
    return blocks + scratch + tiles + 2 * block_q * block_k * 4


class FlashAttentionTemplate:
    name = "flash_attention"
    description = "flash attention over the visible key blocks (scalar-prefetched schedule, GQA groups)"

    def applies(self, task: "Task", analysis: "TaskAnalysis") -> str | None:
        if "attention" not in analysis.patterns:
            return "no attention pattern"
        found = plan(task, ("cpu",))
        return found if isinstance(found, str) else None

    def space(self, task: "Task", analysis: "TaskAnalysis", target: str) -> TemplateSpace:
        size = "full" if tpu_target(target) else "cpu"
        a = analyse(task, size)
        assert not isinstance(a, str)
        if tpu_target(target):
            fits = [(bq, bk) for bq in TPU_BLOCKS_Q for bk in TPU_BLOCKS_K
                    if a.seq_q % bq == 0 and a.seq_k % bk == 0 and vmem_bytes(a, bq, bk) <= TPU_VMEM_BUDGET
                    and (a.bias is None or a.dense or bq == bk)]
            # Default: the biggest square-ish block that fits (fewest steps; causal waste stays small).
            best = max(fits, key=lambda t: (min(t), t[0] * t[1]), default=None)
            if best is None:
                return TemplateSpace(defaults={"block_q": 0, "block_k": 0}, space={"block_q": [], "block_k": []})
            if a.bias is not None and not a.dense:  # square blocks: one parameter
                return TemplateSpace(defaults={"block_q": best[0]}, space={"block_q": sorted({f[0] for f in fits})})
            return TemplateSpace(defaults={"block_q": best[0], "block_k": best[1]},
                                 space={"block_q": sorted({f[0] for f in fits}), "block_k": sorted({f[1] for f in fits})})
        # CPU (interpret mode): grid steps are expensive, so only a few large blocks are worth trying.
        opts_q = sorted(d for d in divisors(a.seq_q) if a.seq_q // d <= 4)
        opts_k = sorted(d for d in divisors(a.seq_k) if a.seq_k // d <= 4)
        if a.bias is not None and not a.dense:
            return TemplateSpace(defaults={"block_q": a.seq_q}, space={"block_q": sorted(set(opts_q) & set(opts_k))})
        return TemplateSpace(defaults={"block_q": a.seq_q, "block_k": a.seq_k if a.mask.all() else a.seq_k // 2},
                             space={"block_q": opts_q, "block_k": opts_k})

    def render(self, task: "Task", params: dict[str, Any], sizes: tuple[str, ...]) -> str:
        found = plan(task, sizes)
        if isinstance(found, str):
            raise EmitError(found)
        block_q = int(params["block_q"])
        block_k = int(params.get("block_k", block_q))
        entry = "_attention" if found.tail else "_flash_attention"
        if found.cut:
            return _render_cut(task, found, block_q, block_k, sizes, entry)
        if found.joined is not None:
            names = arg_names(task)
            joined = [*found.joined.names, names[found.joined.values],
                      *(n for i, n in enumerate(names) if i not in found.joined.parts and i != found.joined.values)]
            return (_with_tail(found, render_flash(task, found, block_q, block_k, names=joined, entry=entry), joined,
                               "_flash_attention") + "\n\n" + joined_wrapper(names, found.joined, found.static,
                                                                            "_flash_attention"))
        if found.layout is None:
            return _with_tail(found, render_flash(task, found, block_q, block_k, entry="_attention" if found.tail else "kernel"),
                              arg_names(task), "kernel")
        names = arg_names(task)
        moved = [names[i] + ("_bhsd" if slot < 3 and found.layout.moves(slot) else "")
                 for slot, i in enumerate(found.layout.order)]
        return (_with_tail(found, render_flash(task, found, block_q, block_k, names=moved, entry=entry), moved,
                           "_flash_attention") + "\n\n" + wrapper_source(names, found.layout, found.static, "_flash_attention"))


def _render_cut(task: "Task", p: FlashPlan, block_q: int, block_k: int, sizes: tuple[str, ...], entry: str) -> str:
    """The flash kernel on the attention core (``_core``), the reference's own code before and after it."""
    shapes = [analyse(task, size) for size in sizes]
    arounds = {size: s.around for size, s in zip(sizes, shapes) if not isinstance(s, str) and s.around is not None}
    core = next(s.core for s in shapes if not isinstance(s, str) and s.core is not None)
    ladder = _ladder_arounds(task, core)
    arounds = {**{size: around for size, (around, _) in ladder.items()}, **arounds}
    integers = {**{size: ints for size, (_, ints) in ladder.items()},
                **{size: integer_statics(static_args(task, size)) for size in sizes}}
    if p.joined is not None:
        names = [f"{'q' if i in {o.arg for o in p.joined.queries} else 'k' if i in {o.arg for o in p.joined.keys} else 'v'}{i}"
                 for i in range(len(core.inputs))]
        names[p.joined.values] = "v"
        joined = [*p.joined.names, "v", *(n for i, n in enumerate(names) if i not in p.joined.parts and i != p.joined.values)]
        source = (_with_tail(p, render_flash(task, p, block_q, block_k, names=joined, entry=entry), joined, "_flash_attention")
                  + "\n\n" + joined_wrapper(names, p.joined, (), "_flash_attention", name="_core"))
    else:
        names = ["q", "k", "v", *(f"side{i}" for i in range(3, len(core.inputs)))]
        source = _with_tail(p, render_flash(task, p, block_q, block_k, names=names, entry="_attention" if p.tail else "_core"),
                            names, "_core")
    call = [f"{', '.join(names)}, *kept = _before({', '.join(arg_names(task))})", f"result = _core({', '.join(names)})"]
    # The reference's float32 products around the core at the passes its tolerance needs (one where it admits
    # bfloat16 rounding): XLA rounds them to one pass on a TPU otherwise.
    passes = kernel_passes(task)
    arounds = {size: around_with_passes(around, passes) for size, around in arounds.items()}
    probes = [(around_with_passes(around, passes), ints) for around, ints in _probe_arounds(task, core)]
    return source + "\n\n" + around_source(arounds, arg_names(task), call, "the attention core",
                                            bool(static_args(task, "cpu")), integers, probes)


def _same_core(found: "AttentionShape | str", operands: list[tuple[int, np.dtype]]) -> bool:
    """Whether ``found`` is the attention cut with a core of these operands (rank and dtype, in order)."""
    return not isinstance(found, str) and found.around is not None and found.core is not None and \
        [(len(v.shape), np.dtype(v.dtype)) for v in found.core.inputs] == operands


def _probe_arounds(task: "Task", core: Program) -> list[tuple[Around, dict[str, int]]]:
    """The code around the core at ``cpu`` with one size parameter doubled at a time (those that trace and
    cut alike), with their integer statics: where two extents coincide at every rendered size (a width equal
    to the heads times their dimension), these tell which one the code reads."""
    operands = [(len(v.shape), np.dtype(v.dtype)) for v in core.inputs]
    found = []
    for name, values in doubled_sizes(task).items():
        task_at = task.with_size(name, values)
        try:
            shape = analyse(task_at, name)
        except Exception:  # the reference does not trace with this parameter doubled (heads that must divide)
            continue
        if _same_core(shape, operands):
            assert not isinstance(shape, str) and shape.around is not None
            found.append((shape.around, integer_statics(static_args(task_at, name))))
    return found


def _ladder_arounds(task: "Task", core: Program) -> dict[str, tuple[Around, dict[str, int]]]:
    """The code around the core at the check ladder's sizes too, with each rung's integer statics: they
    tell which extents follow the arguments and statics, so that one function serves every size; where the
    code is still written per size, no size below ``full`` would run the code priced at ``full`` without
    these rungs. A rung whose core takes other operands adds nothing."""
    from maxkernel.targets.check_size import at_ladder

    operands = [(len(v.shape), np.dtype(v.dtype)) for v in core.inputs]

    def at(task_at: "Task", size: str) -> tuple[Around, dict[str, int]] | None:
        found = analyse(task_at, size)
        if not _same_core(found, operands):
            return None
        assert not isinstance(found, str) and found.around is not None
        return found.around, integer_statics(static_args(task_at, size))

    return at_ladder(task, at)


TAIL_DOC = "What the reference computes from the attention's result, run by XLA on the kernel's output."


def _with_tail(p: FlashPlan, source: str, names: list[str], entry: str) -> str:
    """``source`` (whose attention function is ``_attention`` when there is a tail) and, with a tail, the tail
    and ``entry``: the attention, then the tail on its result."""
    if p.tail is None:
        return source
    args = ", ".join(names[: 4 if p.bias is not None else 3])
    return (source + "\n\n" + p.tail + "\n\n\n" + f"def {entry}({args}, **static):\n"
            + '    """The attention kernel, then what the reference computes from its result."""\n'
            + f"    return _tail(_attention({args}, **static))\n")


SCORES_DN = "(((1,), (1,)), ((), ()))"  # queries [rows, head_dim] times keys [keys, head_dim]
VALUES_DN = "(((1,), (0,)), ((), ()))"  # probabilities [rows, keys] times values [keys, dim]

# The bias block of a step, by the score axes the bias has: the group's heads (all heads share it when it has
# none), the step's query block and key block.
DENSE_SPECS = {
    (0, 1, 2, 3): "            pl.BlockSpec((None, group, block_q, block_k), lambda b, g, t, qb, kb, f: (b, g, qb[t], kb[t])),",
    (1, 2, 3): "            pl.BlockSpec((group, block_q, block_k), lambda b, g, t, qb, kb, f: (g, qb[t], kb[t])),",
    (2, 3): "            pl.BlockSpec((block_q, block_k), lambda b, g, t, qb, kb, f: (qb[t], kb[t])),",
}


def render_flash(task: "Task", p: FlashPlan, block_q: int, block_k: int, names: list[str] | None = None,
                 entry: str = "kernel", doc: str | None = None) -> str:
    """The candidate source; ``names`` (the arguments, default the task's), ``entry`` (the function's name)
    and ``doc`` (the module docstring) let another template call this kernel from its own ``kernel``."""
    names = names if names is not None else arg_names(task)
    q, k, v = names[:3]
    table = names[3] if p.bias is not None and not p.dense else ""  # a relative-position table
    dense = names[3] if p.dense else ""  # a bias read whole, block by block
    if table and block_q != block_k:
        raise EmitError("a blocked bias needs square blocks (block_q == block_k)")
    bias_arg = f", {table or dense}" if table or dense else ""
    bias_ref = " bias_ref," if table or dense else ""
    static = "".join(f", {name}" for name in p.static)
    keywords = f", *{static}" if p.static else ""
    passed = ", ".join(f"{name}={name}" for name in p.static)
    # the mask formula takes the statics it reads, and no other (a batch count the mask never reads)
    visible_args = "".join(f", {name}={name}" for name in (p.mask.params if p.mask is not None else ()))
    f32 = np.dtype(p.in_dtype) == np.float32
    one_pass = f32 and p.passes == 1  # float32 operands rounded to bfloat16 once: what the tolerance admits
    split = f32 and p.passes == 3  # three passes: each float32 operand as a high and a low bfloat16 part
    precision = ", precision=jax.lax.Precision.HIGHEST" if f32 and p.passes == 6 else ""
    operand = ".astype(jnp.bfloat16)" if one_pass else ""
    what = p.mask.description if p.mask is not None else "every key"
    doc = doc if doc is not None else (f'"""{task.id}: flash attention over the visible key blocks ({what}).\n\n'
           "Grid (batch, kv head, step): each step multiplies one query block, holding every query head that\n"
           "shares the kv head, by one key/value block, keeping the running row max and row sum in VMEM; the\n"
           "output is normalised once, after the row's last key block. The steps are the visible (query block,\n"
           "key block) pairs, row by row, prefetched as scalars; only blocks the mask cuts through apply it.\n"
           "MXU operands stay in the input dtype and accumulate in f32. Generated by MaxKernel's rules brain.\n"
           '"""\n')
    lines = [
        doc,
        "import functools",
        "import math",
        "",
        "import jax",
        "import jax.numpy as jnp",
        "import numpy as np",
        "from jax.experimental import pallas as pl",
        "from jax.experimental.pallas import tpu as pltpu",
        "",
        f"BLOCK_Q = {block_q}  # query rows per block (per head)",
        f"BLOCK_K = {block_k}  # keys per block",
        "MASK_VALUE = -1e30  # a masked score: finite, so no inf - inf",
        "M_START = -1e20  # the running max starts above MASK_VALUE: exp(MASK_VALUE - M_START) is 0, so a row with nothing visible yet adds nothing",
        "FIRST, LAST, PARTIAL = 1, 2, 4  # step flags: a row's first key block, its last, the mask cuts it",
        *([f"SOFT_CAP = {scalar_text(np.float64(p.soft_cap))}  # logit soft cap: scores become SOFT_CAP * tanh(s / SOFT_CAP)"]
          if p.soft_cap is not None else []),
        "",
        "",
    ]
    if p.mask is not None:
        lines += [p.mask.source(), ""]
    if table:
        lines += [TILES_SOURCE, ""]
    if split:
        lines += [_mxu_source(SCORES_DN, 3, "_scores"), _mxu_source(VALUES_DN, 3, "_values", split=False)]
    lines += [
        f"def _schedule(seq_q, seq_k, block_q, block_k{keywords}):",
        '    """The grid steps: every (query block, key block) pair with a visible key, row by row, and flags.',
        "",
        "    Positions past the end of a partial last block count as hidden, so its blocks are masked.",
        '    """',
        "    q_count, kv_count = pl.cdiv(seq_q, block_q), pl.cdiv(seq_k, block_k)",
        "    padded = np.zeros((q_count * block_q, kv_count * block_k), dtype=bool)",
        (f"    padded[:seq_q, :seq_k] = _visible(np.arange(seq_q)[:, None], np.arange(seq_k)[None, :]{visible_args})"
         if p.mask is not None else "    padded[:seq_q, :seq_k] = True"),
        "    tiles = padded.reshape(q_count, block_q, kv_count, block_k)",
        "    seen, whole = tiles.any(axis=(1, 3)), tiles.all(axis=(1, 3))",
        "    q_blocks, kv_blocks, flags = [], [], []",
        "    for i, row in enumerate(seen):",
        "        cols = np.flatnonzero(row)",
        "        for n, j in enumerate(cols):",
        "            q_blocks.append(i)",
        "            kv_blocks.append(j)",
        "            flags.append((FIRST if n == 0 else 0) | (LAST if n == len(cols) - 1 else 0)",
        "                         | (0 if whole[i, j] else PARTIAL))",
        "    return tuple(jnp.asarray(np.asarray(x, dtype=np.int32)) for x in (q_blocks, kv_blocks, flags))",
        "",
        "",
        f"def _flash_kernel(q_blocks_ref, kv_blocks_ref, flags_ref, q_ref, k_ref, v_ref,{bias_ref} o_ref, m_ref, l_ref,",
        f"                  acc_ref, *, block_q, block_k, seq_k, scale{', far' if table else ''}{static}):",
        "    t = pl.program_id(2)",
        "    flags = flags_ref[t]",
        "",
        "    @pl.when((flags & FIRST) != 0)",
        "    def _init():  # a new query block: reset the running statistics",
        "        m_ref[...] = jnp.full(m_ref.shape, M_START, jnp.float32)",
        "        l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)",
        "        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)",
        "",
        "    def _accumulate(masked):",
        "        k = k_ref[...]",
        "        v = v_ref[...]",
    ]
    lines += [
        "        if masked:",
        "            # Positions as a column and a row: the formula broadcasts them to the block only at the end.",
        "            rows = q_blocks_ref[t] * block_q + jax.lax.broadcasted_iota(jnp.int32, (block_q, 1), 0)",
        "            cols = kv_blocks_ref[t] * block_k + jax.lax.broadcasted_iota(jnp.int32, (1, block_k), 1)",
        "            visible = cols < seq_k  # keys past the end of a partial last block",
        *([f"            visible = visible & _visible(rows, cols{visible_args})"]
          if p.mask is not None else []),
        "            key_rows = kv_blocks_ref[t] * block_k + jax.lax.broadcasted_iota(jnp.int32, (block_k, 1), 0)",
        "            v = jnp.where(key_rows < seq_k, v, jnp.zeros_like(v))",
    ]
    lines += [
        *(["        distance = jnp.clip(q_blocks_ref[t] - kv_blocks_ref[t], -1, far) + 1  # the bias tile"] if table else []),
        "        for h in range(q_ref.shape[0]):  # the query heads that share this kv head",
        ("            s = _scores(q_ref[h], k)" if split else
         f"            s = jax.lax.dot_general(q_ref[h]{operand}, k{operand}, {SCORES_DN}, "
         f"preferred_element_type=jnp.float32{precision})"),
        "            s = s * scale  # on the f32 scores: a scaled copy of a bf16 q would round every query",
        *(["            s = SOFT_CAP * jnp.tanh(s / SOFT_CAP)  # before the mask: a hidden score stays hidden"]
          if p.soft_cap is not None else []),
    ]
    if table:
        lines += ["            s = s + bias_ref[h, distance].astype(jnp.float32)  # this block distance's bias tile"]
    if dense:
        lines += [f"            s = s + bias_ref[{'h' if 1 in p.dense else '...'}].astype(jnp.float32)  # the bias block "
                  "of these queries and keys"]
    lines += [
        "            if masked:",
        "                s = jnp.where(visible, s, MASK_VALUE)",
    ]
    lines += [
        "            m_prev = m_ref[h]",
        "            m_next = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))",
        "            alpha = jnp.exp(m_prev - m_next)",
        "            p = jnp.exp(s - m_next)",
    ]
    lines += [
        "            l_ref[h] = alpha * l_ref[h] + jnp.sum(p, axis=1, keepdims=True)",
        ("            pv = _values(p, v)" if split else
         f"            pv = jax.lax.dot_general(p.astype({'jnp.bfloat16' if one_pass else 'v.dtype'}), v{operand}, "
         f"{VALUES_DN}, preferred_element_type=jnp.float32{precision})"),
        "            acc_ref[h] = alpha * acc_ref[h] + pv",
        "            m_ref[h] = m_next",
        "",
    ]
    lines += [
        "    pl.when((flags & PARTIAL) != 0)(functools.partial(_accumulate, True))",
        "    pl.when((flags & PARTIAL) == 0)(functools.partial(_accumulate, False))",
    ]
    lines += [
        "",
        "    @pl.when((flags & LAST) != 0)",
        "    def _finish():  # the softmax normalisation, once per row",
        "        o_ref[...] = (acc_ref[...] * (1.0 / l_ref[...])).astype(o_ref.dtype)",
        "",
        "",
        f"def {entry}({q}, {k}, {v}{bias_arg}{keywords}):",
        f"    batch, q_heads, seq_q, head_dim = {q}.shape",
        f"    kv_heads, seq_k, v_dim = {k}.shape[1], {k}.shape[2], {v}.shape[3]  # v_dim may differ from head_dim",
        "    group = q_heads // kv_heads  # consecutive query heads share a kv head",
        *(["    # Square: a tile per block distance; the whole sequence when it is shorter (else a multiple of 8).",
           "    block_q = block_k = seq_q if seq_q == seq_k <= BLOCK_Q else max(8, min(BLOCK_Q, seq_q, seq_k) // 8 * 8)",
           f"    tiles, far = _bias_tiles({table}, block_q)"] if table else
          ["    block_q, block_k = min(BLOCK_Q, seq_q), min(BLOCK_K, seq_k)  # partial last blocks: see the kernel"]),
        f"    q_blocks, kv_blocks, flags = _schedule(seq_q, seq_k, block_q, block_k{', ' + passed if passed else ''})",
        f"    body = functools.partial(_flash_kernel, block_q=block_q, block_k=block_k, seq_k=seq_k, scale={p.scale_text}"
        f"{', far=far' if table else ''}"
        f"{', ' + passed if passed else ''})",
        "    grid_spec = pltpu.PrefetchScalarGridSpec(",
        "        num_scalar_prefetch=3,",
        "        grid=(batch, kv_heads, flags.shape[0]),",
        "        in_specs=[",
        "            pl.BlockSpec((None, group, block_q, head_dim), lambda b, g, t, qb, kb, f: (b, g, qb[t], 0)),",
        "            pl.BlockSpec((None, None, block_k, head_dim), lambda b, g, t, qb, kb, f: (b, g, kb[t], 0)),",
        "            pl.BlockSpec((None, None, block_k, v_dim), lambda b, g, t, qb, kb, f: (b, g, kb[t], 0)),",
        *(["            # The group's bias tiles stay in VMEM for all of its steps: fetched once per (batch, kv head).",
           "            pl.BlockSpec((group, tiles.shape[1], block_q, block_k), lambda b, g, t, qb, kb, f: (g, 0, 0, 0)),"]
          if table else []),
        *([DENSE_SPECS[p.dense]] if dense else []),
        "        ],",
        "        out_specs=pl.BlockSpec((None, group, block_q, v_dim), lambda b, g, t, qb, kb, f: (b, g, qb[t], 0)),",
        "        scratch_shapes=[",
        "            pltpu.VMEM((group, block_q, 1), jnp.float32),  # running row max",
        "            pltpu.VMEM((group, block_q, 1), jnp.float32),  # running row sum",
        "            pltpu.VMEM((group, block_q, v_dim), jnp.float32),  # unnormalised output",
        "        ],",
        "    )",
        "    return pl.pallas_call(",
        "        body,",
        "        grid_spec=grid_spec,",
        f"        out_shape=jax.ShapeDtypeStruct((batch, q_heads, seq_q, v_dim), {dtype_expr(p.out_dtype)}),",
        '        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),',
        f"    )(q_blocks, kv_blocks, flags, {q}, {k}, {v}{', tiles' if table else ''}{', ' + dense if dense else ''})",
    ]
    return "\n".join(lines) + "\n"


FLASH_ATTENTION = FlashAttentionTemplate()
