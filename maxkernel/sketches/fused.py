"""The general rules: one Pallas kernel for any computation of known ops, gridded over its parallel axes.

The reference is traced; :mod:`maxkernel.sketches.axes` finds the axes that reach every output once and
that nothing reduces, contracts, slices or counts (rows of a norm, the batch of a softmax, the output
columns of a projection). The kernel splits those axes over a ``parallel`` grid; each step reads its block
of every input that carries them (the rest whole: weights, norm scales), runs the reference's own ops on
the blocks in VMEM, with the reference's own names, and writes its block of each output once. A
matmul's output columns are one such axis, so a norm before a projection, a dequantizing convert of int8
weights or a per-channel scale after it fuse into one kernel with the matmul: what XLA runs as several
passes over HBM is one. Contracted and reduced axes stay whole in a block (the block must fit VMEM).

What the tuner searches: the block of each gridded axis (aligned to the TPU's 8x128 tiling where the axis
is one of an array's two minor ones) and the order of the grid.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from maxkernel.analysis.precision import kernel_passes
from maxkernel.analysis.program import Const, Node, Program, Var, arg_names, static_args, trace_program
from maxkernel.rewrites.activations import cheaper_activations
from maxkernel.rewrites.conv_taps import convs_as_taps
from maxkernel.rewrites.lane_pairs import lane_pairs
from maxkernel.rewrites.emit import EmitError, emit_function, emittable
from maxkernel.sketches.axes import Axes, Slot, analyse_axes, axis_of, parallel_labels
from maxkernel.sketches.pieces import HEADER, bodies_source, sublane
from maxkernel.targets.blocks import padded_bytes
from maxkernel.templates.base import FIT_SOURCE, NO_MOSAIC, TPU_VMEM_BUDGET, TemplateSpace, tpu_target

if TYPE_CHECKING:
    from jaxbench.task import Task
    from maxkernel.analysis import TaskAnalysis

# What Mosaic cannot run on a block (or what the general rules do not split): left to other sketches.
MAX_CONFIGS = 24  # points of the block space priced by the model before anything is checked
CHECK_FLOPS = 0.8e11  # what a check may cost the judge (maxkernel.targets.check_size allows 1e11), with room
LANES = 128


@dataclass(frozen=True)
class GridAxis:
    """One axis the grid splits: where it sits in each input and output, and its extent. A contracted
    axis (``reduction``) sits in no output: it runs innermost, its partial products summed in VMEM."""

    name: str  # the task's size parameter of this extent where one names it, else axis<k>
    extent: int
    in_axes: tuple[int | None, ...]  # per input: the axis carrying it, or None (read whole)
    out_axes: tuple[int | None, ...]  # per output (None only for a contracted axis)
    reduction: bool = False
    floor: int = 1  # its extent at the smallest size the task is known at (how far a check may shrink it)


@dataclass
class Split:
    """A matmul whose contracted axis the grid splits: ``partial`` (its producers and the matmul, in
    float32) runs every step, ``finish`` (what reads the matmul's result) once, at the last step."""

    partial_inputs: tuple[int, ...]  # indices of the plan's inputs that ``_partial`` reads
    finish_inputs: tuple[int, ...]  # and ``_finish`` (after the accumulated product)
    acc: Var  # the matmul's result, float32, at full size
    dot: Node  # the matmul whose contracted axis is split


@dataclass
class FusedPlan:
    program: Program
    grid: tuple[GridAxis, ...]
    inputs: tuple[Var, ...]
    outputs: tuple[Var, ...]
    variants: dict[tuple[tuple[int, ...], ...], str]  # whole-axis shapes -> emitted body
    split: Split | None = None
    axes: Axes | None = None  # the program's axes, as the grid reads them
    labels: tuple[Slot, ...] = ()  # each grid axis's label in ``axes``
    tail: "Tail | None" = None  # outputs left to XLA
    after: dict[tuple[tuple[int, ...], ...], str] = field(default_factory=dict)  # their function, by shapes
    hoists: dict[str, "Hoist"] = field(default_factory=dict)  # by innermost grid axis: what may be computed once

    def hoist(self) -> "Hoist | None":
        """The hoist for this grid order's innermost axis, if there is one."""
        return self.hoists.get(self.grid[-1].name) if self.grid and not self.grid[-1].reduction else None

    def block_shape(self, var: Var, blocks: dict[str, int]) -> list[int]:
        """``var``'s shape in one grid step."""
        assert self.axes is not None
        by_label = {l: blocks[g.name] for l, g in zip(self.labels, self.grid)}
        return [by_label.get(self.axes.label(var, a), int(d)) for a, d in enumerate(var.shape)]

    @property
    def parallel(self) -> tuple[GridAxis, ...]:
        return tuple(g for g in self.grid if not g.reduction)


def _split_programs(program: Program, axes: Axes, dot: Node) -> tuple[Slot, Program, Program, Split] | None:
    """``dot``'s contracted axis, when the grid may split it: nothing but ``dot`` mixes it, no output
    carries it, no other matmul follows ``dot``, and nothing after ``dot`` reads what was computed for
    it. Then the programs ``_partial`` (the matmul's producers, other matmuls among them, and the matmul,
    accumulating in float32) and ``_finish`` (the accumulated product to the outputs)."""
    from jax import lax

    if not all(isinstance(op, Var) for op in dot.ins):
        return None
    (lc, _), _ = dot.params["dimension_numbers"]
    if len(lc) != 1:
        return None
    label = axes.label(dot.ins[0], int(lc[0]))
    if label in axes.whole or any(axis_of(axes, o, label) is not None for o in program.outputs):
        return None
    before = {id(n) for op in dot.ins for n in program.ancestors(op)}  # type: ignore[arg-type]
    made_before = {id(v) for n in program.nodes if id(n) in before for v in n.outs}
    after = [n for n in program.nodes if id(n) not in before and n is not dot]
    if any(n.prim == "dot_general" for n in after):
        return None
    for n in after:
        for op in n.ins:
            if isinstance(op, Var) and (id(op) in made_before or axis_of(axes, op, label) is not None):
                return None
    if any(isinstance(o, Var) and id(o) in made_before for o in program.outputs):
        return None
    acc = program.fresh(dot.out.shape, np.float32)
    params = {**dot.params, "preferred_element_type": np.dtype(np.float32)}
    partial_nodes = [n for n in program.nodes if id(n) in before] + [Node(dot.primitive, list(dot.ins), [acc], params, dot.source)]
    finish_nodes = list(after)
    if np.dtype(dot.out.dtype) != np.float32:
        finish_nodes.insert(0, Node(lax.convert_element_type_p, [acc], [dot.out],
                                    {"new_dtype": np.dtype(dot.out.dtype), "weak_type": False, "sharding": None}))
    else:
        finish_nodes = [Node(n.primitive, [acc if op is dot.out else op for op in n.ins], n.outs, n.params, n.source, n.notes)
                        for n in finish_nodes]
    reads = lambda nodes: {id(op) for n in nodes for op in n.ins if isinstance(op, Var)}  # noqa: E731
    p_reads, f_reads = reads(partial_nodes), reads(finish_nodes) | {id(o) for o in program.outputs if isinstance(o, Var)}
    p_in = tuple(i for i, v in enumerate(program.inputs) if id(v) in p_reads)
    f_in = tuple(i for i, v in enumerate(program.inputs) if id(v) in f_reads)
    outputs = [acc if o is dot.out and np.dtype(dot.out.dtype) == np.float32 else o for o in program.outputs]
    partial = Program([program.inputs[i] for i in p_in], partial_nodes, [acc])
    finish = Program([acc] + [program.inputs[i] for i in f_in], finish_nodes, outputs, program.out_tree)
    return label, partial, finish, Split(p_in, f_in, acc, dot)


@dataclass
class Hoist:
    """Values the innermost grid axis does not change (a norm of the rows before a projection gridded over
    its columns): computed at that axis's first step into VMEM scratch and read by every later step, so
    they are computed once per block of the outer axes instead of once per step."""

    axis: str  # the innermost grid axis (it runs in order: "arbitrary")
    prologue_inputs: tuple[int, ...]  # inputs ``_prologue`` reads, by index
    main_inputs: tuple[int, ...]  # inputs ``_main`` reads after the cached values
    cached: tuple[Var, ...]  # the cached values (full-size program)
    prologue_nodes: tuple[int, ...]  # ids of the nodes computed once (full-size program)
    text: str  # ``_prologue`` and ``_main``


TRIVIAL = frozenset({"broadcast_in_dim", "reshape", "squeeze", "expand_dims", "convert_element_type", "transpose"})


def hoist_programs(program: Program, axes: Axes, label: Slot) -> tuple[Program, Program, tuple[int, ...], tuple[int, ...]] | None:
    """The nodes whose values do not carry ``label`` and read nothing that does (``_prologue``), and the
    rest (``_main``), when the prologue does real work (more than moving or casting its inputs)."""
    carried = {id(v) for v in program.inputs if axis_of(axes, v, label) is not None}
    invariant: list[Node] = []
    for node in program.nodes:
        reads = [op for op in node.ins if isinstance(op, Var)]
        if any(id(op) in carried for op in reads) or any(axis_of(axes, o, label) is not None for o in node.outs):
            carried.update(id(o) for o in node.outs)
        else:
            invariant.append(node)
    if not any(n.prim not in TRIVIAL for n in invariant):
        return None
    made = {id(o) for n in invariant for o in n.outs}
    main = [n for n in program.nodes if id(n) not in {id(m) for m in invariant}]
    frontier: list[Var] = []
    for node in main:
        for op in node.ins:
            if isinstance(op, Var) and id(op) in made and op not in frontier:
                frontier.append(op)
    if not frontier or any(np.dtype(v.dtype) == np.bool_ for v in frontier):
        return None
    reads = lambda nodes: {id(op) for n in nodes for op in n.ins if isinstance(op, Var)}  # noqa: E731
    p_in = tuple(i for i, v in enumerate(program.inputs) if id(v) in reads(invariant))
    m_in = tuple(i for i, v in enumerate(program.inputs) if id(v) in reads(main) | {id(o) for o in program.outputs})
    prologue = Program([program.inputs[i] for i in p_in], invariant, list(frontier))
    prologue.out_tree = jax.tree_util.tree_structure(tuple(range(len(frontier))))
    body = Program(list(frontier) + [program.inputs[i] for i in m_in], main, list(program.outputs), program.out_tree)
    return prologue, body, p_in, m_in


@dataclass
class Tail:
    """Outputs no gridded axis reaches (a loss's mean over its per-token losses), left to XLA: ``_after``
    computes them from values the kernel also writes out (``frontier``) and from the inputs it reads."""

    program: Program
    frontier: tuple[int, ...]  # kernel outputs ``_after`` reads first, by index among the kernel's outputs
    inputs: tuple[int, ...]  # then these task inputs, by index
    places: tuple[tuple[str, int], ...]  # per original output: ("kernel", j) or ("after", i)
    text: str = ""  # ``_after`` written directly (a final reshape), else emitted from ``program``
    why: str = "What no gridded axis reaches, left to XLA: from the kernel's outputs to the rest of the reference's."


def cut_tail(program: Program) -> tuple[Program, Tail | None]:
    """When no axis reaches every output but one reaches some: the program the kernel runs (those
    outputs, and the values carrying the axis that the others are computed from) and the rest, for XLA."""
    axes = analyse_axes(program)
    if parallel_labels(program, axes) or any(not isinstance(o, Var) for o in program.outputs):
        return program, None
    labels: list[Slot] = []
    for out in program.outputs:  # the axes of one output alone (the others' reductions not yet counted)
        alone = Program(program.inputs, list(program.nodes), [out]).dce()
        axes = analyse_axes(alone)
        labels = parallel_labels(alone, axes)
        if labels:
            break
    if not labels:
        return program, None

    def carries(v: Var) -> bool:
        if (id(v), 0) not in axes.parent:  # not computed on the way to that output
            return False
        return all(sum(axes.label(v, a) == l for a in range(len(v.shape))) == 1 for l in labels)

    kept = [o for o in program.outputs if carries(o)]  # type: ignore[arg-type]
    rest = [o for o in program.outputs if not carries(o)]  # type: ignore[arg-type]
    if not kept or not rest:
        return program, None
    producers = program.producers()
    inputs = {id(v): i for i, v in enumerate(program.inputs)}
    frontier: list[Var] = []
    tail_nodes: set[int] = set()
    read_inputs: list[int] = []
    stack = list(rest)
    while stack:
        v = stack.pop()
        if id(v) in inputs:
            if inputs[id(v)] not in read_inputs:
                read_inputs.append(inputs[id(v)])
            continue
        if carries(v):
            if v not in frontier:
                frontier.append(v)
            continue
        node = producers[v]
        if id(node) in tail_nodes:
            continue
        tail_nodes.add(id(node))
        stack.extend(op for op in node.ins if isinstance(op, Var))
    kernel_outputs = kept + [f for f in frontier if all(f is not k for k in kept)]
    kernel = Program(program.inputs, list(program.nodes), kernel_outputs, None, program._counter,
                     dict(program.dim_names), list(program.notes)).dce()
    kernel.out_tree = jax.tree_util.tree_structure(tuple(range(len(kernel_outputs))))
    read_inputs.sort()
    after = Program(frontier + [program.inputs[i] for i in read_inputs],
                    [n for n in program.nodes if id(n) in tail_nodes], rest)
    after.out_tree = jax.tree_util.tree_structure(tuple(range(len(rest))))
    places = tuple(("kernel", next(j for j, k in enumerate(kernel_outputs) if k is o)) if any(k is o for k in kept)
                   else ("after", next(i for i, r in enumerate(rest) if r is o)) for o in program.outputs)
    index = tuple(next(j for j, k in enumerate(kernel_outputs) if k is f) for f in frontier)
    if not parallel_labels(kernel, analyse_axes(kernel)):
        return program, None
    return kernel, Tail(after, index, tuple(read_inputs), places)


HEAVY = frozenset({"dot_general", "reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "argmax", "argmin"})


def cut_unfusable(program: Program) -> tuple[Program, Tail | None] | str:
    """A reference with ops no kernel holds (``top_k``, a sort, a scatter, a scan, ...): the kernel runs
    the work before the first of them, XLA the rest from the kernel's outputs. Light work (casts, an
    index, a bias) that only the rest reads goes with the rest, so the kernel writes what its heavy work
    (a contraction, a reduction) made; nothing heavy before them leaves no kernel to write."""
    if not any(n.prim in NO_MOSAIC for n in program.nodes):
        return program, None
    first = next(n.prim for n in program.nodes if n.prim in NO_MOSAIC)
    tail: set[int] = set()
    made_after: set[int] = set()
    for node in program.nodes:  # everything that reads what an unfusable op made
        if node.prim in NO_MOSAIC or any(isinstance(op, Var) and id(op) in made_after for op in node.ins):
            tail.add(id(node))
            made_after.update(id(o) for o in node.outs)
    producers = program.producers()
    heavy: dict[int, bool] = {}  # per node: a contraction or reduction on its way from the inputs
    for node in program.nodes:
        heavy[id(node)] = node.prim in HEAVY or any(
            isinstance(op, Var) and op in producers and heavy[id(producers[op])] for op in node.ins)
    outputs = {id(o) for o in program.outputs if isinstance(o, Var)}
    moved = True
    while moved:  # light values only the rest reads are computed there
        moved = False
        users = program.users()
        for node in reversed(program.nodes):
            if id(node) in tail or heavy[id(node)] or any(id(o) in outputs for o in node.outs):
                continue
            readers = [u for o in node.outs for u in users.get(o, [])]
            if readers and all(id(u) in tail for u in readers):
                tail.add(id(node))
                moved = True
    head = [n for n in program.nodes if id(n) not in tail]
    if not any(heavy[id(n)] for n in head):
        return f"{first} in the reference, with no contraction or reduction before it to write a kernel for"
    head_made = {id(o) for n in head for o in n.outs}
    tail_nodes = [n for n in program.nodes if id(n) in tail]
    inputs = {id(v): i for i, v in enumerate(program.inputs)}
    frontier: list[Var] = []
    read_inputs: list[int] = []
    for op in [op for n in tail_nodes for op in n.ins] + list(program.outputs):
        if not isinstance(op, Var):
            continue
        if id(op) in head_made and all(op is not f for f in frontier):
            frontier.append(op)
        elif id(op) in inputs and inputs[id(op)] not in read_inputs and any(op in n.ins for n in tail_nodes):
            read_inputs.append(inputs[id(op)])
    kernel = Program(program.inputs, head, list(frontier), None, program._counter, dict(program.dim_names),
                     list(program.notes)).dce()
    kernel.out_tree = jax.tree_util.tree_structure(tuple(range(len(frontier))))
    if not parallel_labels(kernel, analyse_axes(kernel)):
        return f"{first} in the reference, and no parallel axis in the work before it"
    read_inputs.sort()
    rest = [o for o in program.outputs if isinstance(o, Var) and id(o) not in head_made and id(o) not in inputs]
    after = Program(frontier + [program.inputs[i] for i in read_inputs], tail_nodes, rest)
    after.out_tree = jax.tree_util.tree_structure(tuple(range(len(rest))))
    places = tuple(("kernel", next(j for j, f in enumerate(frontier) if f is o)) if any(f is o for f in frontier)
                   else ("after", next(i for i, r in enumerate(rest) if r is o)) for o in program.outputs)
    return kernel, Tail(after, tuple(range(len(frontier))), tuple(read_inputs), places,
                        why=f"From {first} on, left to XLA (no Mosaic lowering): from the kernel's outputs to the "
                            "rest of the reference's.")


UNARY = frozenset({"convert_element_type", "neg", "exp", "log", "tanh", "logistic", "abs", "sqrt", "rsqrt",
                   "integer_pow", "reduce_precision"})


def sink_reshapes(program: Program) -> None:
    """A unary op after a reshape (a cast of heads split out of a projection's columns) moved before it:
    the same values, with the reshape last, where :func:`peel_reshapes` can leave it to XLA."""
    moved = True
    while moved:
        moved = False
        producers, users = program.producers(), program.users()
        for index, node in enumerate(program.nodes):
            src = node.ins[0] if node.ins else None
            r = producers.get(src) if isinstance(src, Var) else None
            if (node.prim not in UNARY or len(node.ins) != 1 or r is None or r.prim != "reshape"
                    or len(users.get(src, [])) != 1 or src in program.outputs or not isinstance(r.ins[0], Var)):  # type: ignore[arg-type]
                continue
            early = program.fresh(r.ins[0].shape, node.out.dtype)
            first = Node(node.primitive, [r.ins[0]], [early], dict(node.params), node.source, node.notes)
            last = Node(r.primitive, [early], [node.out], dict(r.params), r.source, r.notes)
            program.nodes[index] = last
            program.nodes.insert(program.nodes.index(r) + 1, first)
            program.nodes.remove(r)
            moved = True
            break


def peel_reshapes(program: Program, statics: dict[str, Any] | None = None) -> tuple[Program, Tail | None]:
    """Outputs made by a final reshape (a projection's columns split into heads) computed before it, the
    reshape left to XLA after the kernel, where it only renames the layout: a reshape that splits or
    merges an axis would otherwise keep that axis whole in every block."""
    sink_reshapes(program)
    producers = program.producers()
    finals = [producers.get(o) if isinstance(o, Var) else None for o in program.outputs]
    peeled = [n if n is not None and n.prim == "reshape" and isinstance(n.ins[0], Var) and n.ins[0] not in program.inputs
              else None for n in finals]
    if not any(peeled) or any(isinstance(o, Var) and o in program.inputs for o in program.outputs):
        return program, None
    kernel_outputs: list[Var] = []
    places: list[tuple[str, int]] = []
    frontier: list[Var] = []
    rest: list[Var] = []
    for o, n in zip(program.outputs, peeled):
        if n is None:
            places.append(("kernel", len(kernel_outputs)))
            kernel_outputs.append(o)  # type: ignore[arg-type]
        else:
            places.append(("after", len(rest)))
            rest.append(o)  # type: ignore[arg-type]
            if n.ins[0] not in frontier:
                frontier.append(n.ins[0])  # type: ignore[arg-type]
    kernel_outputs += [f for f in frontier if all(f is not k for k in kernel_outputs)]
    kernel = Program(program.inputs, list(program.nodes), kernel_outputs, None, program._counter,
                     dict(program.dim_names), list(program.notes)).dce()
    kernel.out_tree = jax.tree_util.tree_structure(tuple(range(len(kernel_outputs))))
    after = Program(list(frontier), [n for n in peeled if n is not None], rest)
    after.out_tree = jax.tree_util.tree_structure(tuple(range(len(rest))))
    if not parallel_labels(kernel, analyse_axes(kernel)):
        return program, None
    index = tuple(next(j for j, k in enumerate(kernel_outputs) if k is f) for f in frontier)
    names = [f"value{i}" for i in range(len(frontier))]
    lines = [f"    {names[frontier.index(n.ins[0])]}.reshape({_reshape_shape(names[frontier.index(n.ins[0])], n.ins[0].shape, n.out.shape, statics or {})})"  # type: ignore[arg-type]
             for n in peeled if n is not None]
    text = (f"def _after({', '.join(names)}, static):\n    \"\"\"The kernel's outputs in the reference's shapes: a reshape XLA "
            f"does as a change of layout (the task's static arguments give the extents they name).\"\"\"\n    return (\n" + ",\n".join("    " + line for line in lines) + ",\n    )")
    return kernel, Tail(after, index, (), tuple(places), text)


def split_tail(program: Program, statics: dict[str, Any] | None = None) -> tuple[Program | str, Tail | None]:
    """The part of the reference a kernel runs and what XLA runs after it: ops no kernel holds and what
    reads them, else outputs no gridded axis reaches, else a final reshape into heads (``statics``: the
    task's static arguments, which may name the heads)."""
    cut = cut_unfusable(program)
    if isinstance(cut, str):
        return cut, None
    if cut[1] is not None:
        return cut
    program, tail = cut_tail(program)
    if tail is None and _reshaped_outputs(program):
        program, tail = peel_reshapes(program, statics)
    return program, tail


def _reshape_shape(name: str, src: tuple[int, ...], dst: tuple[int, ...], statics: dict[str, Any]) -> str:
    """``dst`` written from ``src``: the leading axes they share read from the array (so a batch of any size
    follows), the rest as the static argument whose value they are (``static["heads"]``) or as numbers,
    with the last left to follow (-1)."""
    lead = 0
    while lead < min(len(src), len(dst)) and src[lead] == dst[lead]:
        lead += 1
    values = [v for v in statics.values() if isinstance(v, int) and not isinstance(v, bool)]
    named = {int(v): k for k, v in statics.items()
             if isinstance(v, int) and not isinstance(v, bool) and v > 1 and values.count(v) == 1}
    rest = [f'static["{named[int(d)]}"]' if int(d) in named else str(int(d)) for d in dst[lead:]]
    if rest:
        rest[-1] = "-1"
    head = f"{name}.shape[:{lead}]" if lead else "()"
    return f"{head} + ({', '.join(rest)}{',' if len(rest) == 1 else ''})" if rest else head


def _reshaped_outputs(program: Program) -> bool:
    """Whether an output is made by a reshape that merges or splits axes (maybe followed by unary ops)."""
    producers = program.producers()
    for o in program.outputs:
        n = producers.get(o) if isinstance(o, Var) else None
        while n is not None and n.prim in UNARY and isinstance(n.ins[0], Var):
            n = producers.get(n.ins[0])
        if n is not None and n.prim == "reshape" and isinstance(n.ins[0], Var):
            src = [d for d in n.ins[0].shape if d != 1]
            dst = [d for d in n.out.shape if d != 1]
            if src != dst:
                return True
    return False


def _read(program: Program) -> tuple[Axes, list[Slot], tuple[Slot, Program, Program, Split] | None] | str:
    """The axes the grid splits (a contracted one last, when it may be split) or why there are none."""
    split = None
    for dot in reversed([n for n in program.nodes if n.prim == "dot_general"]):  # the last matmul first
        axes = analyse_axes(program, split=dot)
        split = _split_programs(program, axes, dot)
        if split is not None:
            break
    if split is None:
        axes = analyse_axes(program)
    labels = parallel_labels(program, axes)
    if not labels:
        return "no axis reaches every output without being reduced, contracted, sliced or counted"
    return axes, labels, split


def _structure(program: Program, axes: Axes, labels: list[Slot]) -> tuple:
    """Where each gridded axis sits, by input and output position: what must not change with size."""
    return tuple((tuple(axis_of(axes, v, l) for v in program.inputs),
                  tuple(axis_of(axes, o, l) for o in program.outputs)) for l in labels)


def _prepared(task: "Task", size: str, shapes: list[Any] | None = None) -> Program | str:
    try:
        program = trace_program(task, size, shapes).dce()
    except Exception as exc:  # a reference that does not trace at these shapes
        return f"the reference does not trace at the probe shapes ({type(exc).__name__})"
    one_hot_gathers(program)
    convs_as_taps(program)
    lane_pairs(program)  # a minor axis of 2 fills 2 lanes of 128: the pairs on the merged axis instead
    if not drop_empty_values(program):
        return "an empty intermediate that is not only concatenated (Mosaic has no zero-size arrays)"
    unlowerable = mosaic_unlowerable(program)
    if unlowerable is not None:
        return unlowerable
    cheaper_activations(program)  # erfc has no Mosaic lowering; 1 - erf has
    program.dce()
    if any(n.prim == "dot_general" and all(isinstance(op, Var) and np.dtype(op.dtype) == np.float32 for op in n.ins)
           for n in program.nodes):  # only then is the precision the tolerance admits worth measuring
        float32_products(program, _passes(task))
    integer_iotas(program)
    float32_tests(program)
    return program


def mosaic_unlowerable(program: Program) -> str | None:
    """What Mosaic cannot lower on values in VMEM: a strided slice (an associative scan's even and odd
    elements) and interior padding (its interleave). None when there is neither."""
    for node in program.nodes:
        if node.prim == "slice" and any(int(s) != 1 for s in (node.params.get("strides") or ())):
            return "a strided slice in the reference (Mosaic slices values with unit strides only)"
        if node.prim == "pad" and any(int(interior) != 0 for _, _, interior in node.params["padding_config"]):
            return "interior padding in the reference (Mosaic has none)"
    return None


def drop_empty_values(program: Program) -> bool:
    """Drops the zero-size operands of concatenations (an associative scan's edge slices make them) and
    then what made them; False when an empty value is still read elsewhere, which no kernel can hold."""
    def empty(op: Any) -> bool:
        return isinstance(op, Var) and any(int(d) == 0 for d in op.shape)

    for node in program.nodes:
        if node.prim == "concatenate" and any(empty(op) for op in node.ins):
            kept = [op for op in node.ins if not empty(op)]
            if kept:
                node.ins = kept
    program.dce()
    return not any(empty(op) for n in program.nodes for op in n.ins) and not any(empty(o) for o in program.outputs)


ONE_HOT_NOTE = ("one element of each row picked by an integer index, as a sum over a one-hot mask of the row "
                "(positions equal to the index): Mosaic has no gather, and the row is in VMEM already")


def one_hot_gathers(program: Program) -> None:
    """A gather that picks one element along one axis of every row (``take_along_axis``, ``x[rows, idx]``
    with the rows as batching dimensions) written as a masked sum over that axis, so that the rows stay a
    parallel axis and the body needs no gather."""
    from jax import lax

    nodes = []
    for node in program.nodes:
        picked = _one_hot_site(node)
        if picked is None:
            nodes.append(node)
            continue
        operand, indices, axis = picked
        out = node.outs[0]
        note = (ONE_HOT_NOTE,)
        kept = [a for a in range(len(operand.shape)) if a != axis]
        flat = program.fresh(tuple(operand.shape[a] for a in kept), indices.dtype)
        wide = program.fresh(operand.shape, indices.dtype)
        positions = program.fresh(operand.shape, indices.dtype)
        hit = program.fresh(operand.shape, np.bool_)
        zero = program.fresh(operand.shape, operand.dtype)
        masked = program.fresh(operand.shape, operand.dtype)
        summed = program.fresh(flat.shape, operand.dtype)
        nodes += [
            Node(lax.reshape_p, [indices], [flat], {"new_sizes": flat.shape, "dimensions": None, "sharding": None}, node.source, note),
            Node(lax.broadcast_in_dim_p, [flat], [wide], {"shape": operand.shape, "broadcast_dimensions": tuple(kept),
                                                          "sharding": None}, node.source, note),
            Node(lax.iota_p, [], [positions], {"dtype": np.dtype(indices.dtype), "shape": operand.shape,
                                               "dimension": axis, "sharding": None}, node.source, note),
            Node(lax.eq_p, [positions, wide], [hit], {}, node.source, note),
            Node(lax.broadcast_in_dim_p, [Const(np.zeros((), operand.dtype), (), np.dtype(operand.dtype))], [zero],
                 {"shape": operand.shape, "broadcast_dimensions": (), "sharding": None}, node.source, note),
            Node(lax.select_n_p, [hit, zero, operand], [masked], {}, node.source, note),
            Node(lax.reduce_sum_p, [masked], [summed], {"axes": (axis,), "out_sharding": None}, node.source, note),
            Node(lax.reshape_p, [summed], [out], {"new_sizes": out.shape, "dimensions": None, "sharding": None}, node.source, note),
        ]
    program.nodes = nodes


def _one_hot_site(node: Node) -> tuple[Var, Var, int] | None:
    """(operand, indices, axis) of a gather that picks one element along ``axis`` for every position of the
    operand's other axes, else None."""
    if node.prim != "gather" or len(node.ins) != 2 or not all(isinstance(op, Var) for op in node.ins):
        return None
    operand, indices = node.ins
    dn = node.params["dimension_numbers"]
    if tuple(dn.offset_dims) or len(dn.start_index_map) != 1 or tuple(dn.collapsed_slice_dims) != tuple(dn.start_index_map):
        return None
    axis = int(dn.start_index_map[0])
    others = tuple(a for a in range(len(operand.shape)) if a != axis)
    if tuple(dn.operand_batching_dims) != others or any(int(s) != 1 for s in node.params["slice_sizes"]):
        return None
    if tuple(dn.start_indices_batching_dims) != tuple(range(len(others))) or indices.shape[-1] != 1:
        return None
    if tuple(indices.shape[: len(others)]) != tuple(operand.shape[a] for a in others):
        return None
    if int(np.prod(node.outs[0].shape)) != int(np.prod([operand.shape[a] for a in others])):
        return None
    return operand, indices, axis


def merged_batches(program: Program) -> Program:
    """A copy of ``program`` whose matmuls have at most one batch dimension (Mosaic's limit): leading batch
    dimensions of both operands merged into one by a reshape before, and split again after. Done on the
    emitted body only, after the grid was read (a reshape that merges axes would hide them from it)."""
    from jax import lax

    out = program.copy()
    nodes = []
    for node in out.nodes:
        if node.prim != "dot_general" or not all(isinstance(op, Var) for op in node.ins):
            nodes.append(node)
            continue
        (lc, rc), (lb, rb) = node.params["dimension_numbers"]
        n = len(lb)
        if n < 2 or tuple(lb) != tuple(range(n)) or tuple(rb) != tuple(range(n)):
            nodes.append(node)
            continue
        lhs, rhs = node.ins
        batch = int(np.prod(lhs.shape[:n]))
        merged = []
        for op in (lhs, rhs):
            var = out.fresh((batch,) + tuple(op.shape[n:]), op.dtype)  # type: ignore[union-attr]
            nodes.append(Node(lax.reshape_p, [op], [var], {"new_sizes": var.shape, "dimensions": None, "sharding": None},
                              node.source))
            merged.append(var)
        shift = n - 1
        dn = ((tuple(int(a) - shift for a in lc), tuple(int(a) - shift for a in rc)), ((0,), (0,)))
        result = out.fresh((batch,) + tuple(node.out.shape[n:]), node.out.dtype)
        nodes.append(Node(node.primitive, merged, [result], {**node.params, "dimension_numbers": dn}, node.source, node.notes))
        nodes.append(Node(lax.reshape_p, [result], [node.out], {"new_sizes": node.out.shape, "dimensions": None,
                                                                 "sharding": None}, node.source))
    out.nodes = nodes
    return out


def integer_iotas(program: Program) -> None:
    """A floating-point ``iota`` counted in int32 and converted: Mosaic counts positions in integers only."""
    from jax import lax

    nodes = []
    for node in program.nodes:
        out = node.outs[0] if node.outs else None
        if node.prim == "iota" and out is not None and not np.issubdtype(np.dtype(out.dtype), np.integer):
            count = program.fresh(out.shape, np.int32)
            nodes.append(Node(node.primitive, [], [count], {**node.params, "dtype": np.dtype(np.int32)}, node.source,
                              node.notes))
            nodes.append(Node(lax.convert_element_type_p, [count], [out],
                              {"new_dtype": np.dtype(out.dtype), "weak_type": False, "sharding": None}, node.source))
            continue
        nodes.append(node)
    program.nodes = nodes


def float32_tests(program: Program) -> None:
    """``isfinite`` of a narrower float tested on its float32 value: Mosaic's test takes float32 only (the
    answer is the same: widening keeps every finite value finite and every inf and NaN what it was)."""
    from jax import lax

    nodes = []
    for node in program.nodes:
        x = node.ins[0] if node.ins else None
        if node.prim == "is_finite" and isinstance(x, Var) and np.dtype(x.dtype) != np.float32 \
                and np.dtype(x.dtype).itemsize < 4:
            wide = program.fresh(x.shape, np.float32)
            nodes.append(Node(lax.convert_element_type_p, [x], [wide],
                              {"new_dtype": np.dtype(np.float32), "weak_type": False, "sharding": None}, node.source))
            nodes.append(Node(node.primitive, [wide], list(node.outs), dict(node.params), node.source, node.notes))
            continue
        nodes.append(node)
    program.nodes = nodes


BF16_NOTE = ("a TPU multiplies float32 operands at default precision as bfloat16: they are rounded once here, "
             "so the MXU takes them at its bfloat16 rate")


def float32_products(program: Program, passes: int) -> None:
    """Float32 matmuls at the precision the task's tolerance admits (``maxkernel.analysis.precision``):
    at one bfloat16 pass their operands are rounded where the kernel reads them (the product a TPU
    computes at default precision, fed at the MXU's bfloat16 rate instead of the slower float32 operand
    path); otherwise the matmul runs at ``HIGHEST``."""
    from jax import lax

    if passes > 1:
        for node in program.nodes:
            if node.prim == "dot_general" and all(isinstance(op, Var) and np.dtype(op.dtype) == np.float32
                                                  for op in node.ins):
                node.params = {**node.params, "precision": (lax.Precision.HIGHEST, lax.Precision.HIGHEST)}
                node.notes = (*node.notes, "float32 products at HIGHEST: the task's tolerance admits no fewer passes")
        return

    nodes = []
    for node in program.nodes:
        precision = node.params.get("precision")
        default = precision is None or all(p in (None, lax.Precision.DEFAULT) for p in
                                            (precision if isinstance(precision, tuple) else (precision,)))
        if node.prim == "dot_general" and default and all(
                isinstance(op, Var) and np.dtype(op.dtype) == np.float32 for op in node.ins):
            rounded = []
            for op in node.ins:
                var = program.fresh(op.shape, jnp.bfloat16)
                nodes.append(Node(lax.convert_element_type_p, [op], [var],
                                  {"new_dtype": np.dtype(jnp.bfloat16), "weak_type": False, "sharding": None},
                                  node.source, (BF16_NOTE,)))
                rounded.append(var)
            params = dict(node.params)
            if params.get("preferred_element_type") is None:
                params["preferred_element_type"] = np.dtype(np.float32)
            node = Node(node.primitive, rounded, node.outs, params, node.source, node.notes)
        nodes.append(node)
    program.nodes = nodes



def _names(task: "Task", size: str, grid: list[tuple[int, tuple]]) -> list[str]:
    values = task.size(size) if size in task.spec.sizes else {}
    by_value: dict[int, list[str]] = {}
    for name, value in values.items():
        if isinstance(value, int) and not isinstance(value, bool):
            by_value.setdefault(value, []).append(name)
    args = arg_names(task)
    names: list[str] = []
    for extent, (in_axes, out_axes) in grid:
        found = by_value.get(extent, [])
        if len(found) == 1 and found[0] not in names:
            names.append(found[0])  # the size parameter this extent is
            continue
        carrier = next(((args[i] if i < len(args) else f"arg{i}", a) for i, a in enumerate(in_axes) if a is not None),
                       None) or ("out", next(a for a in out_axes if a is not None))
        names.append(f"{carrier[0]}_dim{carrier[1]}")  # where it is read: an input's axis
    return names


def _naming_shapes(program: Program, grid: list[tuple[int, tuple]]) -> list[jax.ShapeDtypeStruct]:
    """The inputs with every gridded extent moved to a size no other dimension has, so that the emitted
    body reads each gridded extent from the input that carries it, never from a whole axis of equal size."""
    taken = {int(d) for v in program.inputs for d in v.shape}
    taken |= {int(a) * int(b) for v in program.inputs for a, b in zip(v.shape, v.shape[1:])}
    chosen: list[int] = []
    primes = iter((3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83, 89, 97))
    for extent, _ in grid:  # a multiple of the extent keeps whatever divides it (heads of a projection)
        size = extent * next(primes)
        while size in taken or size in chosen:
            size = extent * next(primes)
        chosen.append(size)
    shapes = []
    for i, v in enumerate(program.inputs):
        shape = list(v.shape)
        for (extent, (in_axes, _)), size in zip(grid, chosen):
            if in_axes[i] is not None:
                shape[in_axes[i]] = size
        shapes.append(jax.ShapeDtypeStruct(tuple(shape), v.dtype))
    return shapes


def _extent_at(program: Program, g: GridAxis) -> int | None:
    """How long ``g`` is in ``program`` (another size of the task the grid was read from); None when that
    size's program has no such axis (its arrays have another rank there: a batch of one reshaped away)."""
    if g.reduction:
        i = next(k for k, a in enumerate(g.in_axes) if a is not None)
        shape = program.inputs[i].shape if i < len(program.inputs) else ()
        axis = g.in_axes[i]
    else:
        shape, axis = program.outputs[0].shape, g.out_axes[0]  # type: ignore[union-attr]
    return int(shape[axis]) if axis is not None and axis < len(shape) else None


def _ranks(program: Program) -> tuple[int, ...]:
    return tuple(len(v.shape) for v in (*program.inputs, *program.outputs))  # type: ignore[union-attr]


def _whole_key(program: Program, grid: tuple[GridAxis, ...]) -> tuple[tuple[int, ...], ...]:
    """Every input's shape with its gridded axes left out: what the body's constants may follow."""
    keys = []
    for i, v in enumerate(program.inputs):
        gridded = {g.in_axes[i] for g in grid}
        keys.append(tuple(int(d) for a, d in enumerate(v.shape) if a not in gridded))
    return tuple(keys)


def _emit(naming: Program, split: tuple[Slot, Program, Program, Split] | None) -> str:
    """The body (or the split matmul's two halves), statics taken as keyword arguments."""
    if split is None:
        return emit_function(merged_batches(naming), "_reference", "The reference on one block of each input.", size_names=False,
                             slice_extents=True, statics=True)
    _, partial, finish, _ = split
    return (emit_function(merged_batches(partial), "_partial", "The matmul's producers and the matmul on one block of its contracted "
                          "axis, in float32.", size_names=False, slice_extents=True, statics=True) + "\n\n\n"
            + emit_function(merged_batches(finish), "_finish", "From the accumulated product to the outputs.", size_names=False,
                            slice_extents=True, statics=True))


@functools.lru_cache(maxsize=64)
def _passes_of(path: str, digest: str, holder: Any) -> int:
    return kernel_passes(holder())


def _passes(task: "Task") -> int:
    """Bfloat16 passes the task's float32 matmuls need, measured once per task."""
    return _passes_of(str(task.path), task.source_digest, _Holder(task))




@functools.lru_cache(maxsize=64)
def _plan_cached(path: str, digest: str, sizes_key: str, sizes: tuple[str, ...], task_ref: Any) -> FusedPlan | str:
    task = task_ref()
    found: FusedPlan | None = None
    texts: dict[tuple[tuple[int, ...], ...], str] = {}
    tails: dict[tuple[tuple[int, ...], ...], str] = {}
    base: tuple[tuple, tuple[GridAxis, ...]] | None = None  # the priced size's structure and grid
    floors: dict[str, int] = {}
    for size in reversed(sizes):  # the priced (largest) size first: it fixes the grid
        program = _prepared(task, size)
        if isinstance(program, str):
            return program
        if not program.inputs or any(not isinstance(o, Var) for o in program.outputs):
            return "an output is a constant or an input passed through"
        program, tail = split_tail(program, static_args(task, size))  # type: ignore[assignment]
        if isinstance(program, str):
            return program
        read = _read(program)
        if isinstance(read, str):
            return read
        axes, labels, split = read
        gridded = labels + ([split[0]] if split is not None else [])
        structure = _structure(program, axes, gridded)
        raw = [(axes.sizes[l], s) for l, s in zip(gridded, structure)]
        if base is None:
            names = _names(task, size, raw)
            grid = tuple(GridAxis(n, e, s[0], s[1], reduction=split is not None and k == len(labels))  # type: ignore[arg-type]
                         for k, (n, (e, s)) in enumerate(zip(names, raw)))
            base = (structure, grid)
            ranks = _ranks(program)
        else:  # the same grid, less the axes one long at this size (a batch of one)
            extents = [_extent_at(program, g) for g in base[1]]
            if _ranks(program) != ranks or any(e is None for e in extents):
                return "the arrays' ranks change with size (a batch of one reshaped away)"
            kept = [(entry, g) for (entry, g), e in zip(zip(*base), extents) if e > 1]  # type: ignore[operator]
            if structure != tuple(entry for entry, _ in kept):
                return "the parallel axes change with size"
            grid = tuple(replace(g, extent=e) for (_, g), (e, _) in zip(kept, raw))
            floors.update({g.name: min(floors.get(g.name, g.extent), e) for g, e in zip(base[1], extents)})  # type: ignore[type-var]
        # every gridded axis of the priced size moved to a size of its own (one long here included), so one
        # body reads each from the input that carries it at every size
        naming = _prepared(task, size, _naming_shapes(program, [(g.extent, (g.in_axes, g.out_axes)) for g in base[1]]))
        if isinstance(naming, str):
            return naming
        naming, naming_tail = split_tail(naming, static_args(task, size))  # type: ignore[assignment]
        if isinstance(naming, str):
            return naming
        if (naming_tail is None) != (tail is None):
            return "the part left to XLA changes with the extents"
        if naming_tail is not None:  # written from the unique extents, so each is read where it is
            reason = emittable(naming_tail.program)
            if reason is not None:
                return reason
            after = tail.text if tail is not None and tail.text else emit_function(
                naming_tail.program, "_after", naming_tail.why, size_names=False, statics=True)
        naming_read = _read(naming)
        if isinstance(naming_read, str):
            return naming_read
        n_axes, n_labels, n_split = naming_read
        if (n_split is None) != (split is None):
            return "the contracted axis splits at one size and not another"
        n_gridded = n_labels + ([n_split[0]] if n_split is not None else [])
        if _structure(naming, n_axes, n_gridded) != base[0]:
            return "the parallel axes change when their extents do"
        for part in ([naming] if n_split is None else [n_split[1], n_split[2]]):
            reason = emittable(part)
            if reason is not None:
                return reason
        try:
            text = _emit(naming, n_split)
        except EmitError as exc:
            return str(exc)
        key = _whole_key(program, base[1])
        if texts.setdefault(key, text) != text:
            return "the reference is written differently for the same shapes"
        if tail is not None and tails.setdefault(key, after) != after:
            return "the part left to XLA is written differently for the same shapes"
        hoists: dict[str, Hoist] = {}
        if split is None and len(labels) >= 2:
            for k in (0, len(labels) - 1):  # the innermost axis of either grid order
                real, named = hoist_programs(program, axes, labels[k]), hoist_programs(naming, n_axes, n_labels[k])
                if real is None or named is None or emittable(named[0]) or emittable(named[1]):
                    continue
                try:
                    hoisted = (emit_function(merged_batches(named[0]), "_prologue", "What the innermost grid axis does not change: "
                                             "computed at its first step.", size_names=False, slice_extents=True, statics=True)
                               + "\n\n\n" + emit_function(merged_batches(named[1]), "_main", "The rest, at every step, from the "
                                                            "cached values.", size_names=False, slice_extents=True, statics=True))
                except EmitError:
                    continue
                hoists[grid[k].name] = Hoist(grid[k].name, real[2], real[3], tuple(real[0].outputs),  # type: ignore[arg-type]
                                             tuple(id(n) for n in real[0].nodes), hoisted)
        if found is None:
            found = FusedPlan(program, grid, tuple(program.inputs), tuple(program.outputs), {},  # type: ignore[arg-type]
                              split[3] if split is not None else None, axes, tuple(gridded), tail,
                              {}, hoists)
        else:  # a hoist stands only where every size writes it alike
            found.hoists = {n: h for n, h in found.hoists.items() if n not in hoists or hoists[n].text == h.text}
    assert found is not None
    if found.split is not None and len(set(texts.values())) > 1:
        return "a split matmul whose body changes with the shapes"
    found.grid = tuple(replace(g, floor=floors.get(g.name, g.extent)) for g in found.grid)
    found.variants = {(): next(iter(texts.values()))} if len(set(texts.values())) == 1 else texts
    if found.tail is not None:
        found.after = {(): next(iter(tails.values()))} if len(set(tails.values())) == 1 else tails
    return found


def plan(task: "Task", sizes: tuple[str, ...]) -> FusedPlan | str:
    """The general rules' reading of ``task`` at every size in ``sizes`` (the last one's shapes kept)."""
    sizes_key = repr([task.size(s) for s in sizes if s in task.spec.sizes])
    return _plan_cached(str(task.path), task.source_digest, sizes_key, sizes, _Holder(task))


class _Holder:
    """Hands the task to the cached planner without making it part of the cache key."""

    def __init__(self, task: "Task") -> None:
        self.task = task

    def __call__(self) -> "Task":
        return self.task

    def __hash__(self) -> int:
        return 0

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Holder)


# --- blocks ------------------------------------------------------------------------------------------


def _lifted(v: Var, axis: int | None, block: int, extent: int) -> bool:
    """True when a gridded axis is the second-minor axis of ``v`` with a block the sublane tiling does not
    take: the array then travels with a unit axis before its last one, so the split axis is a leading one."""
    if axis is None or len(v.shape) < 2 or axis != len(v.shape) - 2:
        return False
    return block != extent and block % sublane(v.dtype) != 0


def legal_blocks(p: FusedPlan, g: GridAxis) -> list[int]:
    """Blocks of ``g`` every array carrying it can take on TPU: whole, or aligned where it is minor."""
    found = []
    for b in (d for d in range(1, g.extent + 1) if g.extent % d == 0):
        ok = True
        for v, axis in list(zip(p.inputs, g.in_axes)) + list(zip(p.outputs, g.out_axes)):
            if axis is None or b == g.extent:
                continue
            if len(v.shape) == 1:  # a vector split over the grid travels as a column: rows of one
                if b % sublane(v.dtype):
                    ok = False
            elif axis == len(v.shape) - 1 and b % LANES:
                ok = False
            elif axis == len(v.shape) - 2 and b % sublane(v.dtype) and b != 1:
                ok = False
        if ok:
            found.append(b)
    return found


def _block_bytes(v: Var, axes_blocks: dict[int, int]) -> int:
    """A block in VMEM tiles: a minor axis of 2 takes 128 lanes (``targets.blocks.padded_bytes``)."""
    return padded_bytes(tuple(axes_blocks.get(a, int(d)) for a, d in enumerate(v.shape)), np.dtype(v.dtype))


def vmem_bytes(p: FusedPlan, blocks: dict[str, int]) -> int:
    """Double-buffered blocks of every input and output, the accumulator, and the largest value the body
    holds (Mosaic keeps a value that does not fit the vector registers in VMEM)."""
    io = 0
    for i, v in enumerate(p.inputs):
        io += _block_bytes(v, {g.in_axes[i]: blocks[g.name] for g in p.grid if g.in_axes[i] is not None})
    for j, v in enumerate(p.outputs):
        io += _block_bytes(v, {g.out_axes[j]: blocks[g.name] for g in p.grid if g.out_axes[j] is not None})
    if p.split is not None:  # the float32 accumulator of the split matmul
        io += math.prod(p.block_shape(p.split.dot.out, blocks)) * 4 // 2  # one buffer, counted once
    biggest = 0
    for node in p.program.nodes:
        for out in node.outs:
            wide = np.dtype(np.float32) if np.dtype(out.dtype).itemsize < 4 else np.dtype(out.dtype)
            biggest = max(biggest, padded_bytes(tuple(p.block_shape(out, blocks)), wide))
    return 2 * io + biggest


def hbm_bytes(p: FusedPlan, blocks: dict[str, int]) -> float:
    """Bytes read and written from HBM with the grid in plan order: an input's block is fetched again
    whenever its block index changes, i.e. once per step of every grid axis down to the innermost it
    carries (an input no gridded axis splits is fetched once)."""
    steps = [-(-g.extent // blocks[g.name]) for g in p.grid]
    total = float(sum(o.size * np.dtype(o.dtype).itemsize for o in p.outputs))
    for i, v in enumerate(p.inputs):
        carried = [k for k, g in enumerate(p.grid) if g.in_axes[i] is not None]
        fetches = math.prod(steps[: max(carried) + 1]) if carried else 1
        per_fetch = _block_bytes(v, {g.in_axes[i]: blocks[g.name] for g in p.grid if g.in_axes[i] is not None})
        total += fetches * per_fetch
    return total


def step_work(p: FusedPlan, blocks: dict[str, int], hoisting: bool = False) -> tuple[float, float]:
    """(MXU flops, vector ops) of one grid step: every node at its block shape. A value that no gridded
    axis splits is recomputed at every step: what the grid costs in repeated work."""
    mxu = vpu = 0.0
    hoisted = set(p.hoist().prologue_nodes) if hoisting and p.hoist() is not None else set()  # type: ignore[union-attr]
    inner = -(-p.grid[-1].extent // blocks[p.grid[-1].name]) if hoisted else 1
    for node in p.program.nodes:
        share = 1.0 / inner if id(node) in hoisted else 1.0  # computed once per pass over the inner axis
        out = share * math.prod(p.block_shape(node.out, blocks)) if node.outs else 0
        if node.prim == "dot_general":
            (lc, _), _ = node.params["dimension_numbers"]
            lhs = p.block_shape(node.ins[0], blocks) if isinstance(node.ins[0], Var) else []  # type: ignore[arg-type]
            mxu += 2.0 * out * math.prod(lhs[int(a)] for a in lc)
        elif node.prim not in ("broadcast_in_dim", "reshape", "squeeze", "expand_dims", "transpose"):
            vpu += out
    return mxu, vpu


def _estimate(p: FusedPlan, blocks: dict[str, int], target: str = "tpu-v6e", hoisting: bool = False) -> float:
    """Seconds, roughly, on ``target``: HBM traffic or the steps' work, whichever is longer, plus a fixed
    cost per grid step (an order for the shortlist; the evaluator's model prices what is tried)."""
    from maxkernel.targets.specs import load_tpu_spec

    spec = load_tpu_spec(target)
    steps = math.prod(-(-g.extent // blocks[g.name]) for g in p.grid)
    mxu, vpu = step_work(p, blocks, hoisting)
    compute = steps * (mxu / spec.peak_bf16_flops + vpu / spec.vpu_ops)
    return max(hbm_bytes(p, blocks) / spec.hbm_bandwidth, compute) + steps * spec.step_overhead_s


def _cache_bytes(p: FusedPlan, blocks: dict[str, int]) -> int:
    """VMEM scratch of the hoisted values (one buffer each) for this grid order."""
    h = p.hoist()
    if h is None:
        return 0
    return sum(math.prod(p.block_shape(v, blocks)) * max(4, np.dtype(v.dtype).itemsize) for v in h.cached)


def check_flops(p: FusedPlan, blocks: dict[str, int]) -> float:
    """The reference's matmul FLOPs at the size the evaluator checks these blocks at, about: every gridded
    axis taken down to two blocks (a check must run at least two steps of an axis that has them) but not
    below its smallest known extent, every whole axis kept (its block is the whole axis). Blocks whose check
    would be refused are not offered."""
    flops = 0.0
    for node in p.program.nodes:
        if node.prim != "dot_general" or not isinstance(node.ins[0], Var):
            continue
        (lc, _), _ = node.params["dimension_numbers"]
        flops += 2.0 * node.out.size * math.prod(int(node.ins[0].shape[int(a)]) for a in lc)
    for g in p.grid:
        if g.extent >= 2 * blocks[g.name]:
            flops *= max(2 * blocks[g.name], min(g.floor, g.extent)) / g.extent
    return flops


def vmem_budget(target: str) -> int:
    """What the general rules plan to use on ``target``: three quarters of its VMEM (the kernel then raises
    its scoped limit to that), never less than the default budget."""
    from maxkernel.targets.specs import load_tpu_spec

    try:
        physical = load_tpu_spec(target).vmem_bytes
    except Exception:  # not a TPU generation the targets file names
        return TPU_VMEM_BUDGET
    return max(TPU_VMEM_BUDGET, physical * 3 // 4)


ORDERS = ("outputs", "reversed")  # the parallel axes in the first output's order, or the other way round


def ordered(p: FusedPlan, order: str) -> FusedPlan:
    """``p`` with its parallel axes in ``order`` (a split contraction stays innermost)."""
    pairs = list(zip(p.grid, p.labels))
    parallel = [pair for pair in pairs if not pair[0].reduction]
    if order == "reversed":
        parallel.reverse()
    pairs = parallel + [pair for pair in pairs if pair[0].reduction]
    return replace(p, grid=tuple(g for g, _ in pairs), labels=tuple(l for _, l in pairs))


def shortlist(p: FusedPlan, budget: int = TPU_VMEM_BUDGET,
              target: str = "tpu-v6e") -> tuple[dict[str, Any], dict[str, list[Any]]] | None:
    """The default point (the cheapest estimate that fits VMEM, at least two steps where the extents
    allow) and the space worth pricing: per axis the blocks of the best points, and the grid orders,
    narrowed until every combination fits VMEM."""
    options = {g.name: legal_blocks(p, g)[-12:] for g in p.grid}  # the largest: small blocks only add steps
    if any(not o for o in options.values()):
        return None
    orders = ORDERS if len(p.parallel) > 1 else ORDERS[:1]
    points = []
    for combo in itertools.product(*(options[g.name] for g in p.grid)):
        blocks = dict(zip((g.name for g in p.grid), combo))
        if vmem_bytes(p, blocks) > budget:
            continue
        steps = math.prod(-(-g.extent // blocks[g.name]) for g in p.grid)
        if check_flops(p, blocks) > CHECK_FLOPS:
            continue
        for order in orders:
            o = ordered(p, order)
            for hoisting in ((False, True) if o.hoist() is not None else (False,)):
                extra = _cache_bytes(o, blocks) if hoisting else 0
                if vmem_bytes(p, blocks) + extra <= budget:
                    points.append((steps < 2, _estimate(o, blocks, target, hoisting), order, blocks, hoisting))
    if not points:
        return None
    points.sort(key=lambda t: (t[0], t[1]))
    best = {**points[0][3], "grid_order": points[0][2], "hoist": points[0][4]}
    space: dict[str, list[Any]] = {g.name: [] for g in p.grid}
    space["grid_order"] = sorted({t[2] for t in points[:8]})
    space["hoist"] = sorted({t[4] for t in points[:8]})
    choices = len(space["grid_order"]) * len(space["hoist"])
    per_axis = max(2, int(round((MAX_CONFIGS / choices) ** (1 / max(1, len(p.grid))))))
    for _, _, _, blocks, _ in points:
        for name, value in blocks.items():
            if value not in space[name] and len(space[name]) < per_axis:
                space[name].append(value)
    names = [g.name for g in p.grid]
    extents = {g.name: g.extent for g in p.grid}
    while True:  # every combination the tuner may try must fit
        over = None
        for combo in itertools.product(*(space[n] for n in names), space["grid_order"], space["hoist"]):
            blocks, order, hoisting = dict(zip(names, combo[:-2])), combo[-2], combo[-1]
            o = ordered(p, order)
            if vmem_bytes(p, blocks) + (_cache_bytes(o, blocks) if hoisting and o.hoist() is not None else 0) > budget:
                over = (blocks, order, hoisting)
                break
        if over is None:
            break
        blocks, order, hoisting = over
        differs = [n for n in names if blocks[n] != best[n]]
        if differs:
            cut = max(differs, key=lambda n: blocks[n] / extents[n])
            space[cut].remove(blocks[cut])
        elif order != best["grid_order"]:
            space["grid_order"].remove(order)
        else:
            space["hoist"].remove(hoisting)
    return best, {k: sorted(v) for k, v in space.items()}


# --- the sketch ----------------------------------------------------------------------------------------


class FusedGridSketch:
    """The general rules as a sketch: matched on any traced computation with a parallel axis."""

    name = "fused_grid"
    description = ("the reference's own ops fused into one Pallas kernel, gridded over its parallel axes "
                   "(general rules: inputs that do not carry an axis are read whole)")

    def applies(self, task: "Task", analysis: "TaskAnalysis") -> str | None:
        found = plan(task, ("cpu", "full"))
        if isinstance(found, str):
            return found
        target = getattr(analysis, "target", "tpu-v6e") or "tpu-v6e"
        if shortlist(found, vmem_budget(target), target) is None:
            return "no block of the parallel axes fits VMEM with the whole axes read whole"
        return None

    def space(self, task: "Task", analysis: "TaskAnalysis", target: str) -> TemplateSpace:
        p = plan(task, ("cpu", "full"))
        if not tpu_target(target) or isinstance(p, str):
            return TemplateSpace(defaults={}, space={"blocks": []})  # a TPU kernel
        budget = vmem_budget(target)
        chosen = shortlist(p, budget, target)
        if chosen is None:
            return TemplateSpace(defaults={}, space={"blocks": []})
        best, space = chosen
        key = lambda k: k if k in ("grid_order", "hoist") else f"block_{k}"  # noqa: E731
        return TemplateSpace(defaults={**{key(k): v for k, v in best.items()}, "vmem_limit_bytes": budget},
                             space={**{key(k): v for k, v in space.items()}, "vmem_limit_bytes": [budget]})

    def render(self, task: "Task", params: dict[str, Any], sizes: tuple[str, ...]) -> str:
        p = plan(task, ("cpu", "full") if "full" in sizes else sizes)
        if isinstance(p, str):
            raise EmitError(p)
        from maxkernel.sketches.pieces import fused_kernel_source

        p = ordered(p, str(params.get("grid_order", ORDERS[0])))
        blocks = {g.name: int(params[f"block_{g.name}"]) for g in p.grid}
        names = arg_names(task)[: len(p.inputs)]
        names = names + [f"arg{i}" for i in range(len(names), len(p.inputs))]
        lifted = [any(_lifted(v, g.in_axes[i], blocks[g.name], g.extent) for g in p.grid)
                  for i, v in enumerate(p.inputs)]
        out_lifted = [any(_lifted(o, g.out_axes[j], blocks[g.name], g.extent) for g in p.grid)
                      for j, o in enumerate(p.outputs)]
        header = (f'"""{task.id}: {self.description}.\n\nGenerated by MaxKernel\'s rules brain: a grid over '
                  + ", ".join(f"{g.name} ({blocks[g.name]} a step)" for g in p.grid) + '.\n"""\n')
        constants = [f"BLOCK_{g.name.upper()} = {blocks[g.name]}  # {g.name} per grid step" for g in p.grid]
        limit = int(params.get("vmem_limit_bytes") or 0)
        if limit > TPU_VMEM_BUDGET:
            constants.append(f"VMEM_LIMIT_BYTES = {limit}  # the blocks, double-buffered, and the body's values")
        return "\n".join([header, HEADER, *constants, "", FIT_SOURCE, "",
                          (p.hoist().text + "\n\n" if params.get("hoist") and p.hoist() is not None  # type: ignore[union-attr]
                           else bodies_source(p.variants, "_reference") if p.split is None else p.variants[()] + "\n\n"),
                          bodies_source(p.after, "_after") if p.tail is not None else "",
                          fused_kernel_source(p, names, lifted, out_lifted, p.program.out_tree, limit > TPU_VMEM_BUDGET,
                                              p.hoist() if params.get("hoist") else None)])


FUSED_GRID = FusedGridSketch()
