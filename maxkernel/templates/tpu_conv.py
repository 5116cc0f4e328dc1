"""TPU convolution as implicit GEMM: the reference's one convolution on the MXU, its epilogue after it.

What an expert writes for ``epilogue(conv(x, w))`` (2-D or 3-D, stride 1; a transposed convolution, which the
references write as the stride-1 convolution of the stride-dilated input, runs as its sub-pixel decomposition
from :mod:`maxkernel.templates.conv_phases`: the stride-1 convolution of the undilated input with the output
phases stacked on the channels, each phase's channels multiplied only at the window offsets its kernel reaches,
the phases interleaved in VMEM and written in the reference's layout, and the tail run there too when it
computes each output plane from that plane alone, such as a layer norm over the width):
- XLA lays the input out first: the convolution's padding and input dilation applied, the spatial axes
  flattened (channels stay first, no transpose). An output position ``p`` then reads input position
  ``p + shift`` for each kernel offset, ``shift`` fixed by the offset, when each output row spans the
  padded input's full width
  (the columns past the true output width are computed, and dropped in VMEM before the one write);
- the grid steps over blocks of ``BLOCK_D`` output planes (rows in 2-D) of each sample; a step's input is
  its planes plus the halo the kernel reaches, read as an element-offset window of the flat input
  (``pl.Element``: the windows overlap, the halo is fetched from HBM by both steps that need it, and no
  copy of the input is made; the last window's reach past the input's end feeds only positions past the
  output, which are dropped and left out of any sums). No im2col buffer: each offset's window is a static
  slice of the slab in VMEM, [in-channels on sublanes, positions on lanes];
- the output tile [``BLOCK_N`` out-channels x the step's output positions] accumulates in f32 over the
  (kernel offsets x ``BLOCK_C`` in-channel blocks) reduction, the in-channel blocks on the innermost grid
  axis; MXU operands bf16 with f32 accumulation, for f32 inputs at full precision the 3-pass bf16 split or
  ``HIGHEST`` (both in the tuning space, as in :mod:`maxkernel.templates.tpu_gemm`, whose product source
  this template reuses): weight tile [BLOCK_N, BLOCK_C] @ window [BLOCK_C, positions]. Channels on the
  tile's rows, positions on its lanes: the output is written in the reference's channels-first layout;
- an elementwise epilogue with per-channel operands (biases, scales) runs on the accumulator on the last
  in-channel step; an epilogue whose reductions sum the output over every position (norms over positions,
  groups or the batch, global pooling) is split (:mod:`maxkernel.templates.conv_stats`): its per-position
  prefix runs on the accumulator, which is written together with per-block f32 sums of it and of its
  square per channel, and XLA finishes from those sums, reading the output once (not at all when only
  the sums are needed); any other epilogue (reductions over channels alone) runs in XLA on the
  convolution's output, as the GEMM template does for epilogues that couple rows.
Every shape is read from the arguments; block sizes are the named constants, halved only to divide a
smaller extent, so the body priced at ``full`` is the body checked at a smaller twin size.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import itertools
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from maxkernel.analysis.graph import ELEMENTWISE, REDUCE
from maxkernel.analysis.program import Node, Program, Var, arg_names, input_shapes, static_args, trace_program
from maxkernel.analysis.statics import bind, used_statics
from maxkernel.rewrites.activations import _one_minus_erf, _one_minus_erf_in_f32
from maxkernel.rewrites.build import splice_traced
from maxkernel.rewrites.emit import EmitError, dtype_expr, emit_function, emittable
from maxkernel.templates.base import FIT_SOURCE, TemplateSpace, tpu_target
from maxkernel.templates.conv_phases import PHASES_SOURCE, Phases, kernel_shape, phases_of
from maxkernel.templates.conv_rows import (TAP_GROUPS_SOURCE, RowsConv, per_channel_tail, rows_constants, rows_conv,
                                            rows_conv_source, rows_geometry, rows_kernel_source, rows_space, served,
                                            returned)
from maxkernel.templates.conv_stats import StatsSplit, split
from maxkernel.templates.tpu_gemm import HEADER, HIGHEST, W_KN_DIMENSIONS, _epilogue_name, _epilogue_source, _extent, _mxu_source, _passes, _size_statics, _vmem_cap, chosen_passes, ladder_epilogues

if TYPE_CHECKING:
    from jaxbench.task import Task
    from maxkernel.analysis import TaskAnalysis

TPU_BLOCKS_N = (128, 256)
TPU_BLOCKS_C = (128, 256, 512)
TPU_BLOCKS_D = (1, 2, 4, 8, 16, 32, 64)
# Output positions a step computes at most: the accumulator and one window stay a few MiB of VMEM.
MAX_STEP_POSITIONS = 8192
LANES, SUBLANES = 128, 8  # the (sublane, lane) tile of a 32-bit VMEM array
# Elements of an operand the tail reads (a norm's scale) that a decomposed transposed convolution's kernel
# holds whole in VMEM, when it runs the tail on each step's planes.
TILE_OPERAND_LIMIT = 1 << 16


@dataclass
class ConvPlan:
    """One stride-1 convolution of an input and the reference's computation after it."""

    x: Var
    weights: list[Var]  # the inputs the convolution's kernel is computed from
    rhs: Program | None  # inputs ``weights`` -> the kernel [O, C, *taps]; None: the kernel is an input
    n: int
    c: int
    o: int
    taps: tuple[int, ...]
    padded: tuple[int, ...]  # spatial extents of the padded, dilated input
    out_spatial: tuple[int, ...]
    pads: tuple[tuple[int, int, int], ...]  # per spatial axis: low, high, interior (lax.pad)
    in_dtype: np.dtype
    precision: str
    tail: Program  # inputs: the convolution's output ``h`` then the other inputs it reads
    tileable: bool  # elementwise, every other operand per output channel
    stats: StatsSplit | None = None  # a prefix fused in the kernel and a finish from per-channel sums
    epilogues: dict[tuple[int, ...], str] = field(default_factory=dict)  # XLA's part, per extents
    prefix: str = ""  # the fused prefix's source, when split
    # A transposed convolution (dilated input): the kernel runs its sub-pixel decomposition, the fields
    # above (o, taps, padded, out_spatial) then describe that stride-1 convolution of phase-stacked channels.
    phases: Phases | None = None
    tile_tail: bool = False  # decomposed: the tail runs in the kernel on each step's interleaved planes
    # A channels-last 1-D convolution (any stride): the kernel of :mod:`maxkernel.templates.conv_rows`.
    rows: RowsConv | None = None

    @property
    def finish(self) -> Program:
        """What XLA runs after the kernel: the finish from the sums when split, else the whole tail."""
        return self.stats.finish if self.stats is not None else self.tail

    @property
    def writes_output(self) -> bool:
        """Whether the kernel writes the convolution's output (a split finish may need only its sums)."""
        if self.stats is None:
            return True
        a = self.stats.finish.inputs[0]
        return a in self.stats.finish.outputs or any(a in n.ins for n in self.stats.finish.nodes)

    @property
    def out(self) -> Var:
        out = self.tail.outputs[0]
        assert isinstance(out, Var)
        return out

    @property
    def nd(self) -> int:
        return len(self.taps)


def _natural(node: Node) -> str | None:
    p = node.params
    x = node.ins[0]
    nd = len(getattr(x, "shape", ())) - 2
    dn = p["dimension_numbers"]
    natural = tuple(range(nd + 2))
    if nd not in (2, 3):
        return f"a {nd}-D convolution (the template serves 2-D and 3-D, and 1-D with the channels last)"
    if not (tuple(dn.lhs_spec) == natural and tuple(dn.rhs_spec) == natural and tuple(dn.out_spec) == natural):
        return "a convolution in another layout than NC... / OI... / NC..."
    if tuple(p["window_strides"]) != (1,) * nd or tuple(p["rhs_dilation"]) != (1,) * nd:
        return "a strided or kernel-dilated convolution"
    if int(p["feature_group_count"]) != 1 or int(p["batch_group_count"]) != 1:
        return "a grouped convolution"
    if any(int(lo) < 0 or int(hi) < 0 for lo, hi in p["padding"]):
        return "negative padding"
    return None


def _per_channel(tail: Program, v: Var, o: int) -> bool:
    """Whether ``v`` reaches the output only broadcast along the channel axis (a bias of [O] or [O, 1, 1])."""
    users = tail.users().get(v, [])
    for node in users:
        if node.prim != "broadcast_in_dim":
            return False
        shape, dims = tuple(node.params["shape"]), tuple(node.params["broadcast_dimensions"])
        if shape != (1, o) + (1,) * (len(shape) - 2) or any(e != 1 and d != 1 for e, d in zip(v.shape, dims)):
            return False
    return bool(users) and int(np.prod(v.shape)) == o


def _erfc_as_erf(tail: Program) -> None:
    """erfc (exact GELU) has no Mosaic lowering; 1 - erf has (in float32 for a narrower float, rounded back
    once). Only this substitution: the cheaper Mish of ``cheaper_activations`` is proven on values up to a
    size, so it would write the tail differently at ``full`` and at a smaller check size."""
    for node in list(tail.nodes):
        if node.prim == "erfc" and isinstance(node.ins[0], Var) and node.out.dtype in (np.float32, jnp.bfloat16):
            splice_traced(tail, node, _one_minus_erf if node.out.dtype == np.float32 else _one_minus_erf_in_f32)


def _cut(program: Program, conv: Node) -> tuple[Var, list[Var], Program | None, Program, list[Var]] | str:
    """The convolution's input, the inputs its kernel is computed from, that computation (None when the
    kernel is an input), and the reference after the convolution (reading its output ``h``, then the other
    inputs it reads, listed last); or why the program is not one convolution of an input and a tail."""
    x, rhs = conv.ins
    if x not in program.inputs:
        return "the convolution's input is computed (the template reads it from an input)"
    assert isinstance(x, Var) and isinstance(rhs, Var)
    upstream = program.ancestors(rhs)
    weights = [v for v in program.inputs if any(v in nd.ins for nd in upstream)] if upstream else [rhs]
    if x in weights or (not upstream and rhs not in program.inputs):
        return "the kernel is computed from the convolution's input"
    if np.dtype(x.dtype) != np.dtype(rhs.dtype) or np.dtype(x.dtype) not in (np.dtype("float32"), np.dtype("bfloat16")):
        return "operands that are not both float32 or both bfloat16"
    skip = {id(conv)} | {id(nd) for nd in upstream}
    nodes = [nd for nd in program.nodes if id(nd) not in skip]
    if any(v is x or v in weights for nd in nodes for v in nd.ins):
        return "the computation after the convolution reads its input or kernel again"
    if len(program.outputs) != 1 or not isinstance(program.outputs[0], Var):
        return "the output is not one array"
    h = Var("h", conv.out.shape, conv.out.dtype)
    others = [v for v in program.inputs if v is not x and v not in weights and any(v in nd.ins for nd in nodes)]
    tail = Program([h] + others, [Node(nd.primitive, list(nd.ins), list(nd.outs), dict(nd.params)) for nd in nodes],
                   list(program.outputs), program.out_tree)
    tail.substitute(conv.out, h)
    _erfc_as_erf(tail)
    tail.dce()
    prologue = None
    if upstream:
        prologue = Program(list(weights), [Node(nd.primitive, list(nd.ins), list(nd.outs), dict(nd.params))
                                           for nd in upstream], [rhs], None)
    return x, weights, prologue, tail, others


def _precision_of(conv: Node) -> str:
    precision = conv.params.get("precision")
    levels = precision if isinstance(precision, (tuple, list)) else (precision,)
    names = {str(getattr(q, "name", q)).upper() for q in levels if q is not None}
    return HIGHEST if HIGHEST in names else "DEFAULT"


def match(program: Program) -> ConvPlan | str:
    """The convolution-then-tail structure of ``program``, or why it has none."""
    convs = [n for n in program.nodes if n.prim == "conv_general_dilated"]
    if len(convs) != 1:
        return f"{len(convs)} convolutions (the template computes exactly one)"
    if any(n.prim == "dot_general" for n in program.nodes):
        return "a matmul beside the convolution"
    conv = convs[0]
    why = _natural(conv)
    rows = rows_conv(conv) if why is not None and len(conv.ins[0].shape) == 3 else None
    if isinstance(rows, str):
        return rows
    if why and rows is None:
        return why
    found = _cut(program, conv)
    if isinstance(found, str):
        return found
    x, weights, prologue, tail, others = found
    if rows is not None:
        o = int(conv.out.shape[2])
        return ConvPlan(x, weights, prologue, int(x.shape[0]), int(x.shape[2]), o, (rows.taps,),
                        (int(x.shape[1]) + rows.low + rows.high,), (int(conv.out.shape[1]),),
                        ((rows.low, rows.high, 0),), np.dtype(x.dtype), _precision_of(conv), tail,
                        per_channel_tail(tail, others, o, conv.out.shape, program), rows=rows)
    rhs = conv.ins[1]
    p = conv.params
    o, c = rhs.shape[:2]
    taps = tuple(rhs.shape[2:])
    pads = tuple((int(lo), int(hi), int(d) - 1) for (lo, hi), d in zip(p["padding"], p["lhs_dilation"]))
    padded = tuple(lo + hi + (s - 1) * (d + 1) + 1 for (lo, hi, d), s in zip(pads, x.shape[2:]))
    out_spatial = tuple(conv.out.shape[2:])
    phases = phases_of(pads)
    tileable = phases is None and program.outputs[0].shape == conv.out.shape and all(
        nd.prim in ELEMENTWISE or nd.prim == "broadcast_in_dim" for nd in tail.nodes) and all(
        _per_channel(tail, v, o) for v in others)
    if phases is not None:  # the kernel computes the phases' stride-1 convolution and interleaves them
        windows, padded = kernel_shape(tuple(x.shape[2:]), taps, phases)
        o, taps = o * math.prod(phases.strides), windows
        out_spatial = tuple(e - t + 1 for e, t in zip(padded, taps))
    stats = None if tileable or phases is not None else split(tail, o, len(taps))
    return ConvPlan(x, weights, prologue, x.shape[0], c, o, taps, padded, out_spatial, pads,
                    np.dtype(x.dtype), _precision_of(conv), tail, tileable, stats,
                    phases=phases, tile_tail=phases is not None and _plane_local(tail))


def _plane_local(tail: Program) -> bool:
    """Whether the tail computes each output position from its own sample and output plane of ``h`` alone:
    elementwise work, reductions over the channel and in-plane axes only (never the batch axis 0 or the
    plane axis 2), and every other operand small and constant along those two axes. Then it computes on
    one step's planes what it computes on the whole output."""
    h = tail.inputs[0]
    if len(tail.outputs) != 1 or getattr(tail.outputs[0], "shape", None) != h.shape:
        return False
    others = set(tail.inputs[1:])
    for node in tail.nodes:
        operands = [v for v in node.ins if isinstance(v, Var)]
        if node.prim in REDUCE:
            if node.prim not in ("reduce_sum", "reduce_max", "reduce_min") or len(operands[0].shape) != len(h.shape) \
                    or {0, 2} & {int(a) for a in node.params["axes"]}:
                return False
        elif node.prim == "broadcast_in_dim":
            v = operands[0] if operands else None
            dims = tuple(node.params["broadcast_dimensions"])
            if v in others and any(d in (0, 2) and e != 1 for e, d in zip(v.shape, dims)):
                return False
        elif node.prim not in ELEMENTWISE or any(v in others for v in operands):
            return False  # a tail operand enters only through a broadcast: its extents are checked there
    return all(int(np.prod(v.shape)) <= TILE_OPERAND_LIMIT for v in others)


def _plane_probe(text: str, p: ConvPlan, static: dict[str, Any]) -> bool:
    """Whether the tail as emitted (``text``, for the extents ``p`` was traced at; ``static``: the task's
    static arguments, the ones it reads passed by name) gives on one sample's two output planes what it
    gives on the whole output there: emission may read a constant from an extent, and one read from the
    batch or the plane extent would differ on a step's planes."""
    names: dict[str, Any] = {"jax": jax, "jnp": jnp, "math": math}
    exec(text, names)
    fn = next(v for k, v in names.items() if k.startswith("_epilogue") and callable(v))
    fn = functools.partial(fn, **{name: static[name] for name in used_statics(p.finish)})
    keys = jax.random.split(jax.random.key(0), len(p.tail.inputs))
    args = [jax.random.normal(k, v.shape, jnp.float32).astype(v.dtype) for k, v in zip(keys, p.tail.inputs)]
    planes = slice(0, min(2, args[0].shape[2]))
    whole = np.asarray(fn(*args))[-1:, :, planes]
    part = np.asarray(fn(args[0][-1:, :, planes], *args[1:]))
    return part.shape == whole.shape and bool(np.allclose(part, whole, rtol=1e-5, atol=1e-5))


def plan(task: "Task", sizes: tuple[str, ...]) -> ConvPlan | str:
    """The plan at every size, the epilogue emitted once when it reads every size from its operands, else
    once per (output extents, integer statics) it is rendered for."""
    found: list[ConvPlan] = []
    for size in sizes:
        p = match(trace_program(task, size).dce())
        if isinstance(p, str):
            return p
        reason = served(p) if p.rows is not None else None
        if reason is not None:
            return reason
        for program in (p.tail, p.rhs):
            reason = emittable(program) if program is not None else None
            if reason is not None:
                return reason
        found.append(p)
    prefixes = {emit_function(p.stats.prefix, "_prefix", "The reference after its convolution, per position.", statics=True)
                for p in found if p.stats is not None}
    if len(prefixes) != 1 or any(p.stats is None or emittable(p.stats.finish) for p in found):
        for p in found:  # split at every size the same way, or at none
            p.stats = None
    texts: dict[tuple[int, ...], str] = {}
    for size, p in zip(sizes, found):
        key, text = _epilogue_text(task, size, p)
        if texts.setdefault(key, text) != text:
            return "the computation after the convolution is written differently for the same extents"
    if found[-1].tile_tail:
        cpu = found[sizes.index("cpu")] if "cpu" in sizes else match(trace_program(task, "cpu").dce())
        probe = _epilogue_text(task, "cpu", cpu) if isinstance(cpu, ConvPlan) and cpu.tile_tail else None
        if probe is None or {_generic(k, t) for k, t in texts.items()} != {_generic(*probe)} \
                or not _plane_probe(probe[1], cpu, static_args(task, "cpu")):  # type: ignore[arg-type]
            for p in found:  # written differently at another size, or reading an extent a step does not hold
                p.tile_tail = False
    if found[0].rows is not None:
        reason = _length_padding(task, found)
        if reason is not None:
            return reason
    if len({(p.in_dtype, p.precision, p.tileable, p.tile_tail, p.pads, p.phases, p.rows, p.rhs is None) for p in found}) != 1:
        return "a convolution laid out differently at different sizes"
    found[-1].prefix = prefixes.pop() if found[-1].stats is not None else ""
    generic = {_generic(key, text) for key, text in texts.items()}
    one = generic.pop() if len(generic) == 1 else None
    if one is not None and one == _probe_text(task, found[0]):
        found[-1].epilogues = {(): one}
        return found[-1]

    def text_at(task_at: "Task", size: str) -> tuple[tuple[int, ...], str] | None:
        p = match(trace_program(task_at, size).dce())
        return None if isinstance(p, str) else _epilogue_text(task_at, size, p)

    found[-1].epilogues = ladder_epilogues(task, texts, text_at)
    return found[-1]


def _length_padding(task: "Task", found: list[ConvPlan]) -> str | None:
    """A strided channels-last convolution's padding as the reference chooses it for each input length, set on
    every plan (None), or why it cannot be read. "SAME" pads by what the stride leaves over, so the padding
    changes with the length modulo the stride: traced at one length of every residue (and once more, a whole
    stride on, to see the rule repeat), the kernel picks its padding by the length it is called with."""
    rows = found[0].rows
    assert rows is not None
    paddings = {(p.rows.low, p.rows.high) for p in found if p.rows is not None}
    table: dict[int, tuple[int, int]] = {}
    if rows.stride > 1:
        shapes = list(input_shapes(task, "cpu"))
        index = arg_names(task).index(found[0].x.name)
        x = shapes[index]
        for extra in range(rows.stride + 1):
            length = int(x.shape[1]) + extra
            shapes[index] = jax.ShapeDtypeStruct((x.shape[0], length, x.shape[2]), x.dtype)
            try:
                probe = match(trace_program(task, "cpu", shapes).dce())
            except Exception:  # the reference ties the length to another input's extent
                table = {}
                break
            if isinstance(probe, str) or probe.rows is None:
                table = {}
                break
            seen = (probe.rows.low, probe.rows.high)
            if table.setdefault(length % rows.stride, seen) != seen:
                return "a 1-D convolution whose padding changes with the length other than by its residue"
    if not table and len(paddings) > 1:
        return "a 1-D convolution padded differently at different sizes"
    for p in found:
        assert p.rows is not None
        if table and table[int(p.x.shape[1]) % rows.stride] != (p.rows.low, p.rows.high):
            return "a 1-D convolution whose padding changes with the length other than by its residue"
    by_residue = tuple(table[k] for k in range(rows.stride)) if len(set(table.values())) > 1 else ()
    low, high = by_residue[0] if by_residue else paddings.pop()
    for p in found:
        assert p.rows is not None
        p.rows = dataclasses.replace(p.rows, low=low, high=high, by_residue=by_residue)
        p.pads = ((low, high, 0),)
    return None


def _epilogue_text(task: "Task", size: str, p: ConvPlan) -> tuple[tuple[int, ...], str]:
    """What XLA (or the kernel) runs after the convolution at ``size``, keyed by the extents it is for."""
    static = static_args(task, size)
    key = tuple(p.tail.inputs[0].shape[1:]) + tuple(int(static[k]) for k in _size_statics(static))
    return key, emit_function(p.finish, _epilogue_name(key), f"The reference after its convolution, for {_extent(key)}.",
                              statics=True)


def _generic(key: tuple[int, ...], text: str) -> str:
    """An epilogue's text without the extents it was written for."""
    return text.replace(_epilogue_name(key), "_epilogue").replace(f", for {_extent(key)}.", ".")


def _probe_text(task: "Task", p: ConvPlan) -> str | None:
    """The tail emitted from a trace whose output extents all differ (None when the reference does not
    trace there). Emission reads each constant's extent from an operand dimension of the same value; where
    two extents coincide at every rendered size (square images) it may read the wrong one, which the
    probe shows as a different text: then one function is written per extent instead."""
    if p.phases is not None:  # the probe's extents below are those of a stride-1 convolution
        return None
    shapes = list(input_shapes(task, "cpu"))
    index = arg_names(task).index(p.x.name)
    x = shapes[index]
    if p.rows is not None:  # channels last: one length, longer by one stride and one
        shapes[index] = jax.ShapeDtypeStruct((x.shape[0], x.shape[1] + p.rows.stride + 1, x.shape[2]), x.dtype)
    else:
        spatial = tuple(e + 1 + 2 * k for k, e in enumerate(x.shape[2:]))
        out = [e - t + 1 for e, t in zip(spatial, p.taps)]
        if len(set(out) | {p.n, p.o}) != len(out) + len({p.n, p.o}):
            return None
        shapes[index] = jax.ShapeDtypeStruct(x.shape[:2] + spatial, x.dtype)
    try:
        probe = match(trace_program(task, "cpu", shapes).dce())
    except Exception:  # the reference ties its extents together (a norm over a width equal to the channels)
        return None
    if isinstance(probe, str) or (probe.stats is None) != (p.stats is None):
        return None
    if p.rows is not None and len({probe.out_spatial[0], p.n, p.o}) != 3:
        return None
    return emit_function(probe.finish, "_epilogue", "The reference after its convolution.", statics=True)


def _round_up(a: int, b: int) -> int:
    return -(-a // b) * b


def _step_layout(spatial, taps, block_d, max_positions):  # type: ignore[no-untyped-def]
    """How a step tiles the padded input of extents ``spatial``: the extents it is laid out at, the output
    planes (rows in 2-D) a step computes, its positions, its slab's length and each kernel offset's shift.

    Every output row spans the laid-out width, so each kernel offset is one fixed shift along the flattened
    positions. A step's positions fill whole lanes, and in 2-D its output rows whole sublanes; where one
    such unit of planes would exceed ``max_positions``, the innermost axis is widened with zero columns
    until a single plane fills whole lanes."""
    sublanes = 8 if len(taps) == 2 else 1

    def unit(extents):  # type: ignore[no-untyped-def]
        return math.lcm(128 // math.gcd(math.prod(extents[1:]), 128), sublanes)

    if unit(spatial) * math.prod(spatial[1:]) > max_positions:
        lanes = 128 // math.gcd(math.prod(spatial[1:-1]), 128)
        spatial = tuple(spatial[:-1]) + (-(-spatial[-1] // lanes) * lanes,)
    out = spatial[0] - taps[0] + 1
    planes = -(-min(block_d, out) // unit(spatial)) * unit(spatial)
    rows = planes * math.prod(spatial[1:])
    shifts = tuple(sum(i * math.prod(spatial[a + 1:]) for a, i in enumerate(offset))
                   for offset in itertools.product(*(range(t) for t in taps)))
    return tuple(spatial), planes, rows, -(-(rows + shifts[-1]) // 128) * 128, shifts


LAYOUT_SOURCE = inspect.getsource(_step_layout).replace("  # type: ignore[no-untyped-def]", "") + "\n"


def step_shape(p: ConvPlan, block_d: int) -> tuple[int, int, int]:
    """Planes a step computes, its output positions and its slab's length, as the kernel derives them."""
    _, planes, rows, span, _ = _step_layout(p.padded, p.taps, block_d, MAX_STEP_POSITIONS)
    return planes, rows, span


def conv_vmem_bytes(p: ConvPlan, block_n: int, block_c: int, block_d: int, passes: int) -> int:
    """VMEM one step plans for, in the (8, 128) tiles Mosaic lays blocks out in: double-buffered slab,
    weight and output blocks, the f32 accumulator, one window and its bf16 halves when split."""
    _, rows, span = step_shape(p, block_d)
    item = p.in_dtype.itemsize
    taps = math.prod(p.taps)
    subl_c, lanes_c, subl_n = _round_up(block_c, SUBLANES), _round_up(block_c, LANES), _round_up(block_n, SUBLANES)
    out_item = np.dtype(p.out.dtype).itemsize if p.tileable else 4
    blocks = 2 * (subl_c * span * item + taps * subl_n * lanes_c * item + subl_n * rows * out_item)
    window = subl_c * rows * 4
    split = 2 * 2 * (subl_c * rows + taps * subl_n * lanes_c) if passes == 3 else 0
    interleave = 2 * subl_n * rows * 4 if p.phases is not None else 0  # the tile's phases put in place
    return blocks + subl_n * rows * 4 + window + split + interleave


def _legal(extent: int, options: tuple[int, ...]) -> list[int]:
    """Channel blocks on TPU: a multiple of the tiling dividing the extent, or the whole extent."""
    return sorted({b for b in options if extent % b == 0 and b < extent} | {extent})


class TpuConvTemplate:
    name = "tpu_conv"
    description = ("convolution as implicit GEMM on the MXU (kernel offsets x in-channel blocks accumulated in "
                   "f32 from a halo'd slab), the reference's epilogue fused or left to XLA")

    def applies(self, task: "Task", analysis: "TaskAnalysis") -> str | None:
        found = plan(task, ("cpu", "full"))
        return found if isinstance(found, str) else None

    def space(self, task: "Task", analysis: "TaskAnalysis", target: str) -> TemplateSpace:
        if not tpu_target(target):
            return TemplateSpace(defaults={}, space={"block_n": []})  # a TPU kernel: Mosaic-only operations
        p = plan(task, ("full",))
        assert not isinstance(p, str)
        cap = _vmem_cap(target)
        admitted = _passes(p, task)
        worst = min(admitted)
        if p.rows is not None:
            defaults, rows = rows_space(p, cap, admitted)
            return TemplateSpace(defaults=defaults, space=rows)
        bn_options = [b for b in _legal(p.o, TPU_BLOCKS_N) if b % SUBLANES == 0 or b == p.o]
        if p.phases is not None:  # a step holds every phase of its channels: the products it skips, the interleave
            bn_options = [p.o]
        bc_options = _legal(p.c, TPU_BLOCKS_C)
        least = step_shape(p, 1)[0]  # the fewest planes a step can compute
        fits = [(bn, bc, bd) for bn in bn_options for bc in bc_options for bd in TPU_BLOCKS_D
                if bd <= max(p.out_spatial[0], least)
                and (step_shape(p, bd)[1] <= MAX_STEP_POSITIONS or step_shape(p, bd)[0] == least)
                and conv_vmem_bytes(p, bn, bc, bd, worst) <= cap]
        if not fits:
            return TemplateSpace(defaults={"block_n": 0}, space={"block_n": []})
        # The widest channel blocks (each slab read once per out-channel block), then the most positions a step.
        bn, bc, bd = max(fits, key=lambda t: (t[0], t[1], t[2]))
        legal = set(fits)
        space: dict[str, list[Any]] = {
            "block_n": sorted({bn} | ({bn // 2} if (bn // 2, bc, bd) in legal else set())),
            "block_c": [bc],
            "block_d": sorted({bd} | ({bd // 2} if (bn, bc, bd // 2) in legal else set())),
            "passes": admitted,
        }
        return TemplateSpace(defaults={"block_n": bn, "block_c": bc, "block_d": bd, "passes": worst}, space=space)

    def render(self, task: "Task", params: dict[str, Any], sizes: tuple[str, ...]) -> str:
        p = plan(task, sizes)
        if isinstance(p, str):
            raise EmitError(p)
        passes = chosen_passes(p, params, task)
        if p.rows is not None:
            return self._render_rows(task, p, params, sizes, passes)
        doc = (f'"""{task.id}: {self.description}.\n\nGenerated by MaxKernel\'s rules brain: {params["block_n"]} '
               f"out-channels x {params['block_d']} output planes a step, {params['block_c']} in-channels a "
               f"reduction step, {passes} MXU pass{'es' if passes > 1 else ''} per product, the epilogue "
               + ("fused" if p.tileable else "split: its per-position prefix fused, per-channel sums written beside "
                  "the output, XLA finishing from them" if p.stats is not None
                  else "left to XLA (it reduces or couples positions)") + '.\n"""\n')
        parts = [doc, HEADER.replace("import math\n", "import itertools\nimport math\n"), _constants(params), FIT_SOURCE, "", _mxu_source(W_KN_DIMENSIONS, passes),
                 _epilogue_source(p), LAYOUT_SOURCE]  # type: ignore[arg-type]
        if p.stats is not None:
            parts.append(p.prefix + "\n\n\n" + CHANNEL_SUMS_SOURCE)
        if p.phases is not None:
            parts.append(_phases_constants(p.phases) + "\n\n" + PHASES_SOURCE)
        if p.rhs is not None:
            parts.append(emit_function(p.rhs, "_conv_weight", "The kernel the reference convolves with, from its inputs.")
                         + "\n\n")
        parts += [_conv_source(p), _kernel_source(p, arg_names(task), _size_statics(static_args(task, sizes[0])))]
        return "\n".join(parts)


    def _render_rows(self, task: "Task", p: ConvPlan, params: dict[str, Any], sizes: tuple[str, ...], passes: int) -> str:
        """A channels-last 1-D convolution: the kernel of :mod:`maxkernel.templates.conv_rows`."""
        doc = (f'"""{task.id}: a channels-last 1-D convolution as row GEMMs on the MXU (the stride\'s phases side by '
               f"side on the lanes, each tap a window of rows), the reference's tail "
               + ("fused" if p.tileable else "left to XLA") + f".\n\nGenerated by MaxKernel's rules brain: "
               f"{params['block_rows']} output positions x {params['block_n']} output channels a step, {passes} MXU "
               f"pass{'es' if passes > 1 else ''} per product.\n\"\"\"\n")
        parts = [doc, HEADER, rows_constants(p, params, passes), rows_geometry(p), FIT_SOURCE, "",
                 _mxu_source(W_KN_DIMENSIONS, passes), _epilogue_source(p), TAP_GROUPS_SOURCE]  # type: ignore[arg-type]
        weight = f"_conv_weight({', '.join(v.name for v in p.weights)})" if p.rhs is not None else p.weights[0].name
        if p.rhs is not None:
            parts.append(emit_function(p.rhs, "_conv_weight", "The kernel the reference convolves with, from its inputs.")
                         + "\n\n")
        parts += [rows_conv_source(p), rows_kernel_source(p, arg_names(task), _size_statics(static_args(task, sizes[0])),
                                                          weight, _bound_epilogue(p))]
        return "\n".join(parts)


def _constants(params: dict[str, Any]) -> str:
    return "\n".join([
        f"BLOCK_N = {int(params['block_n'])}  # output channels per tile (the tile's rows)",
        f"BLOCK_C = {int(params['block_c'])}  # input channels per reduction step (innermost, accumulated)",
        f"BLOCK_D = {int(params['block_d'])}  # output planes (rows in 2-D) per step, rounded up to fill lanes",
        f"MAX_STEP_POSITIONS = {MAX_STEP_POSITIONS}  # output positions a step computes at most",
    ]) + "\n"


def _phases_constants(phases: Phases) -> str:
    return "\n".join([
        f"STRIDES = {phases.strides!r}  # the transposed convolution's strides (its input's dilation)",
        f"PAD_LOW = {phases.low!r}  # the padding of the dilated input the reference convolves, per axis",
        f"PAD_HIGH = {phases.high!r}",
    ]) + "\n"


def _channel_sums(v):
    """Sum of a tile [1, channels, planes, ...] over its positions, per channel: [1, channels]."""
    return jnp.sum(v, axis=tuple(range(2, v.ndim)))


CHANNEL_SUMS_SOURCE = inspect.getsource(_channel_sums) + "\n"


def _fused_operands(p: ConvPlan) -> list[str]:
    """The per-channel operands the kernel reads for the epilogue it fuses."""
    if p.tileable:
        return [v.name for v in p.tail.inputs[1:]]
    return [v.name for v in p.stats.prefix.inputs[1:]] if p.stats is not None else []


def _phases_conv_source(p: ConvPlan) -> str:
    """The decomposed transposed convolution's kernel: each phase's channels accumulate only the window
    offsets its kernel reaches, the tile's phases are interleaved in VMEM and written in the reference's
    layout, with the tail run on them when it is plane-local."""
    names = [v.name for v in p.tail.inputs[1:]] if p.tile_tail else []
    refs = "".join(f"{name}_ref, " for name in names)
    loads = ", ".join(["y"] + [f"{name}_ref[...].reshape(shapes[{i}])" for i, name in enumerate(names)])
    store = (f"o_ref[...] = epilogue({loads}).astype(o_ref.dtype)" if p.tile_tail
             else "o_ref[...] = y.astype(o_ref.dtype)")
    doc = ("the reference's tail run on\n    them (it computes each position from its own sample and plane)"
           if p.tile_tail else "the tail left to XLA")
    return f'''def _conv_kernel(x_ref, w_ref, {refs}o_ref, acc_ref, *, shifts, live, epilogue, shapes, tile, crop, strides,
                 extents):
    """Per phase, the sum over the window offsets its kernel reaches of its weight rows @ shifted window of the
    slab, into an f32 tile of [phases x channels, positions]; on the last in-channel step the phases are put in
    place (output s m + r) in VMEM and the step's output planes written once, {doc}."""
    c = pl.program_id(3)

    @pl.when(c == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    rows = acc_ref.shape[1]
    group = acc_ref.shape[0] // len(live)  # the channels of one phase
    for r, offsets in enumerate(live):
        if offsets:
            acc = acc_ref[r * group:(r + 1) * group]
            for t in offsets:
                acc = acc + _product(w_ref[t, r * group:(r + 1) * group], x_ref[:, shifts[t]:shifts[t] + rows])
            acc_ref[r * group:(r + 1) * group] = acc

    @pl.when(c == pl.num_programs(3) - 1)
    def _store():
        acc = acc_ref[...]
        y = acc.reshape(tile)[(Ellipsis,) + tuple(slice(0, e) for e in crop)]
        y = _depth_to_space(y, strides, (y.shape[2] * strides[0],) + extents[1:])
        {store}

'''


def _conv_source(p: ConvPlan) -> str:
    if p.phases is not None:
        return _phases_conv_source(p)
    extras = _fused_operands(p)
    refs = "".join(f"{name}_ref, " for name in extras)
    loads = ", ".join(["y"] + [f"{name}_ref[...].reshape((acc.shape[0],) + shapes[{i}])"
                               for i, name in enumerate(extras)])
    outs = "o_ref, " if p.writes_output else ""
    if p.tileable:
        store = f"o_ref[...] = epilogue({loads}).astype(o_ref.dtype)"
        doc = "the reference's epilogue on the last in-channel step, one write"
    elif p.stats is not None:
        outs += "s_ref, q_ref, "
        store = "\n        ".join(
            [f"a = epilogue({loads})"] + (["o_ref[...] = a.astype(o_ref.dtype)"] if p.writes_output else []) + [
                "# The last step's planes past the output are computed, not written: left out of the sums.",
                "keep = jax.lax.broadcasted_iota(jnp.int32, a.shape, 2) < first - step * tile[2]",
                "a = jnp.where(keep, a.astype(jnp.float32), 0.0)",
                "s_ref[...] = _channel_sums(a).reshape(s_ref.shape)",
                "q_ref[...] = _channel_sums(a * a).reshape(q_ref.shape)"])
        doc = ("the reference's per-position prefix on the last in-channel step, "
               + ("written once with " if p.writes_output else "only ") + "its f32 sums and sums of squares per channel")
    else:
        store = "o_ref[...] = y.astype(o_ref.dtype)"
        doc = "written once on the last in-channel step"
    return f'''def _conv_kernel(x_ref, w_ref, {refs}{outs}acc_ref, *, shifts, epilogue, shapes, tile, crop, first):
    """Sum over kernel offsets of weight tile @ shifted window of the slab, into an f32 tile of
    [BLOCK_N channels, positions]; cropped to the output's extents in VMEM, {doc}."""
    step, c = pl.program_id(1), pl.program_id(3)

    @pl.when(c == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    rows = acc_ref.shape[1]
    acc = acc_ref[...]
    for t, shift in enumerate(shifts):
        acc = acc + _product(w_ref[t], x_ref[:, shift:shift + rows])
    acc_ref[...] = acc

    @pl.when(c == pl.num_programs(3) - 1)
    def _store():
        acc = acc_ref[...]
        # The step's planes at the padded input's extents, the columns past the output width dropped.
        y = acc.reshape(tile)[(Ellipsis,) + tuple(slice(0, e) for e in crop)]
        {store}

'''


def _phases_kernel_source(p: ConvPlan, names: list[str], statics: list[str]) -> str:
    """``kernel`` for a transposed convolution: its sub-pixel decomposition's one pallas_call, which writes the
    output in the reference's layout (and runs a plane-local tail), XLA running any other tail after it."""
    x = p.x.name
    weight = f"_conv_weight({', '.join(v.name for v in p.weights)})" if p.rhs is not None else p.weights[0].name
    others = [v.name for v in p.tail.inputs[1:]]
    fused = others if p.tile_tail else []
    extents = "(" + ", ".join(["w0.shape[0]", "*transposed"] + [f"static[{k!r}]" for k in statics]) + ")"
    out_dtype = dtype_expr(np.dtype(p.out.dtype if p.tile_tail else p.tail.inputs[0].dtype))
    item = p.in_dtype.itemsize
    in_specs = ["pl.BlockSpec((None, pl.Element(block_c), pl.Element(span, (0, beyond))), "
                "lambda b, s, j, cc: (b, cc * block_c, s * rows))",
                "pl.BlockSpec((len(shifts), o, block_c), lambda b, s, j, cc: (0, 0, cc))"]
    in_specs += ["pl.BlockSpec((1, math.prod(shapes[" + str(i) + "])), lambda b, s, j, cc: (0, 0))"
                 for i in range(len(fused))]
    operands = ["flat", "w_taps"] + [f"{name}.reshape((1, -1))" for name in fused]
    lines = [
        f"def kernel({', '.join(names)}, **static):",
        f"    w0 = {weight}",
        "    # The transposed convolution's sub-pixel decomposition: one stride-1 convolution of the undilated",
        "    # input whose output channels are the phases' (each with the taps reaching its outputs).",
        "    w = _phase_weight(w0, STRIDES, PAD_LOW)",
        f"    n, c = {x}.shape[:2]",
        "    o, taps = w.shape[0], w.shape[2:]",
        "    live = _phase_live(w0.shape[2:], STRIDES, PAD_LOW)  # per phase, the window offsets it needs",
        "    # XLA lays the input out for the kernel: padded for the phases' common window, the spatial axes",
        "    # flattened.",
        f"    xp, transposed = _phase_input({x}, w0.shape[2:], STRIDES, PAD_LOW, PAD_HIGH)",
        "    out = tuple(e - t + 1 for e, t in zip(xp.shape[2:], taps))",
        "    spatial, planes, rows, span, shifts = _step_layout(xp.shape[2:], taps, BLOCK_D, MAX_STEP_POSITIONS)",
        "    if spatial != xp.shape[2:]:  # widened with zero columns: one plane fills whole lanes",
        "        xp = jnp.pad(xp, ((0, 0), (0, 0)) + tuple((0, e - d) for e, d in zip(spatial, xp.shape[2:])))",
        "    steps = -(-out[0] // planes)",
        "    block_c = _fit(BLOCK_C, c)",
        "    flat = xp.reshape((n, c, -1))",
        "    # Each step reads its slab (its planes and the halo past them) as an element-offset window of the",
        "    # flat input; what the last window reads past the input's end feeds only planes past the output.",
        "    beyond = max(0, (steps - 1) * rows + span - flat.shape[2])",
        "    w_taps = jnp.moveaxis(w.reshape((o, c, -1)), 2, 0)  # [offsets, phases x O, C]",
        "    tile = (1, o, planes) + spatial[1:]",
        f"    epilogue = _epilogue_for({extents})",
        *_bound_epilogue(p),
        f"    shapes = ({''.join(f'{name}.shape, ' for name in fused)})",
        "    # A step's output planes: the phases' planes times the stride, every channel, the output's extents.",
        "    block = (1, w0.shape[0], planes * STRIDES[0]) + transposed[1:]",
        f"    planned = 2 * (max(block_c, 8) * span + len(shifts) * o * max(block_c, 128)) * {item}"
        " + 5 * o * rows * 4 + 5 * max(block_c, 8) * rows * 4",
        "    h = pl.pallas_call(",
        f"        functools.partial(_conv_kernel, shifts=shifts, live=live, epilogue={'epilogue' if fused else 'None'}, "
        "shapes=shapes, tile=tile, crop=out[1:], strides=STRIDES, extents=transposed),",
        f"        out_shape=jax.ShapeDtypeStruct((n, w0.shape[0]) + transposed, {out_dtype}),",
        "        grid=(n, steps, 1, c // block_c),",
        "        in_specs=[" + ", ".join(in_specs) + "],",
        "        # The last step's planes past the output are not written (a partial edge block).",
        "        out_specs=pl.BlockSpec(block, lambda b, s, j, cc: (b, 0, s) + (0,) * (len(block) - 3)),",
        "        scratch_shapes=[pltpu.VMEM((o, rows), jnp.float32)],",
        "        compiler_params=pltpu.CompilerParams(",
        '            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary"),',
        "            vmem_limit_bytes=max(32 << 20, planned + (planned >> 1))),",
        f"    )({', '.join(operands)})",
    ]
    lines += returned(p.tile_tail, others, "couples positions across planes or samples")
    return "\n".join(lines) + "\n"


def _bound_epilogue(p: ConvPlan) -> list[str]:
    """The kernel's line giving the epilogue the statics it reads (none when it reads none)."""
    used = used_statics(p.finish)
    return [f"    epilogue = functools.partial(epilogue, {bind(used)})  # the statics it reads"] if used else []


def _kernel_source(p: ConvPlan, names: list[str], statics: list[str]) -> str:
    if p.phases is not None:
        return _phases_kernel_source(p, names, statics)
    x = p.x.name
    weight = f"_conv_weight({', '.join(v.name for v in p.weights)})" if p.rhs is not None else p.weights[0].name
    others = [v.name for v in p.finish.inputs[(4 if p.stats is not None else 1):]]
    fused = _fused_operands(p)
    extents = "(" + ", ".join(["o", "*out"] + [f"static[{k!r}]" for k in statics]) + ")"
    out_dtype = dtype_expr(np.dtype(p.out.dtype if p.tileable else (
        p.stats.prefix.outputs[0].dtype if p.stats is not None else p.tail.inputs[0].dtype)))
    item = p.in_dtype.itemsize
    in_specs = ["pl.BlockSpec((None, pl.Element(block_c), pl.Element(span, (0, beyond))), "
                "lambda b, s, j, cc: (b, cc * block_c, s * rows))",
                "pl.BlockSpec((len(shifts), block_n, block_c), lambda b, s, j, cc: (0, j, cc))"]
    operands = ["flat", "w_taps"]
    shapes = "()"
    if fused:
        in_specs += ["pl.BlockSpec((block_n, 1), lambda b, s, j, cc: (j, 0))"] * len(fused)
        operands += [f"{name}.reshape((o, 1))" for name in fused]
        shapes = "(" + "".join(f"{name}.shape[1:], " for name in fused) + ")"
    prefix_statics = used_statics(p.stats.prefix) if p.stats is not None else []
    fused_epilogue = ("epilogue" if p.tileable else (f"functools.partial(_prefix, {bind(prefix_statics)})" if prefix_statics
                      else "_prefix") if p.stats is not None else "None")
    results = ", ".join((["h"] if p.writes_output else []) + (["s", "q"] if p.stats is not None else []))
    out_shapes, out_specs = [], []
    if p.writes_output:
        out_shapes.append(f"jax.ShapeDtypeStruct((n, o) + out, {out_dtype})")
        out_specs.append("pl.BlockSpec((1, block_n, planes) + out[1:], lambda b, s, j, cc: (b, j, s) + (0,) * (len(out) - 1))")
    if p.stats is not None:
        out_shapes += ["jax.ShapeDtypeStruct((n, steps, 1, o), jnp.float32)"] * 2
        out_specs += ["pl.BlockSpec((1, 1, 1, block_n), lambda b, s, j, cc: (b, s, 0, j))"] * 2
    layout = [
        f"    w = {weight}",
        f"    n, c = {x}.shape[:2]",
        "    o, taps = w.shape[0], w.shape[2:]",
        "    # XLA lays the input out for the kernel: the convolution's padding and input dilation applied,",
        "    # the spatial axes flattened.",
        (f"    xp = jax.lax.pad({x}, jnp.zeros((), {x}.dtype), ((0, 0, 0), (0, 0, 0)) + {p.pads!r})"
         if any(any(q) for q in p.pads) else f"    xp = {x}")]
    lines = [
        f"def kernel({', '.join(names)}, **static):",
        *layout,
        "    out = tuple(e - t + 1 for e, t in zip(xp.shape[2:], taps))",
        "    spatial, planes, rows, span, shifts = _step_layout(xp.shape[2:], taps, BLOCK_D, MAX_STEP_POSITIONS)",
        "    if spatial != xp.shape[2:]:  # widened with zero columns: one plane fills whole lanes",
        "        xp = jnp.pad(xp, ((0, 0), (0, 0)) + tuple((0, e - d) for e, d in zip(spatial, xp.shape[2:])))",
        "    steps = -(-out[0] // planes)",
        "    block_n, block_c = _fit(BLOCK_N, o), _fit(BLOCK_C, c)",
        "    flat = xp.reshape((n, c, -1))",
        "    # Each step reads its slab, its output planes' rows and the halo the kernel reaches past them, as an",
        "    # element-offset window of the flat input: overlapping windows, no copy. The last window reaches past",
        "    # the input's end; what it reads there feeds only positions past the output, which are dropped.",
        "    beyond = max(0, (steps - 1) * rows + span - flat.shape[2])",
        "    w_taps = jnp.moveaxis(w.reshape((o, c, -1)), 2, 0)  # [offsets, O, C]",
        "    tile = (1, block_n, planes) + spatial[1:]",
        f"    epilogue = _epilogue_for({extents})",
        *_bound_epilogue(p),
        f"    planned = 2 * (max(block_c, 8) * span + len(shifts) * block_n * max(block_c, 128)) * {item}"
        " + 3 * block_n * rows * 4 + 5 * max(block_c, 8) * rows * 4",
        f"    {results}{',' if ',' not in results else ''} = pl.pallas_call(",
        f"        functools.partial(_conv_kernel, shifts=shifts, epilogue={fused_epilogue}, "
        f"shapes={shapes}, tile=tile, crop=out[1:], first=out[0]),",
        f"        out_shape=[{', '.join(out_shapes)}],",
        "        grid=(n, steps, o // block_n, c // block_c),",
        "        in_specs=[" + ", ".join(in_specs) + "],",
        "        # The last step's planes past the output are not written (a partial edge block).",
        f"        out_specs=[{', '.join(out_specs)}],",
        "        scratch_shapes=[pltpu.VMEM((block_n, rows), jnp.float32)],",
        "        compiler_params=pltpu.CompilerParams(",
        '            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary"),',
        "            vmem_limit_bytes=max(32 << 20, planned + (planned >> 1))),",
        f"    )({', '.join(operands)})",
    ]
    if p.tileable:
        lines.append("    return h")
    elif p.stats is not None:
        lines += [
            "    # XLA finishes from the per-block sums: summed over the steps, per (sample, channel).",
            "    sums = jnp.sum(s, axis=(1, 2)).reshape((n, o) + (1,) * len(out))",
            "    squares = jnp.sum(q, axis=(1, 2)).reshape((n, o) + (1,) * len(out))",
            "    counts = jnp.full(sums.shape, math.prod(out), jnp.float32)  # the positions each sum spans",
            f"    return epilogue({'h' if p.writes_output else 'None'}, sums, squares, counts"
            f"{''.join(', ' + name for name in others)})"]
    else:
        lines.append("    # The epilogue reduces over positions or channels: XLA runs it on the convolution's output.")
        lines.append(f"    return epilogue(h{''.join(', ' + name for name in others)})")
    return "\n".join(lines) + "\n"


TPU_CONV = TpuConvTemplate()
