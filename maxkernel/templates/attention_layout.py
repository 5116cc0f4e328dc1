"""Attention in any layout and argument order, read as the ``[batch, heads, seq, head_dim]`` form the flash
kernel computes.

People write attention many ways: ``[batch, seq, heads, head_dim]`` inputs scored with
``einsum("bqhd,bkhd->bhqk")``, the values before the queries, grouped-query keys widened with
``jnp.repeat`` over the heads. The roles are found by data flow, never by argument order or name: the
queries and keys are what the first matmul reads, the values what the second reads besides the scores.
Each role's axes are read from the matmuls' dimension numbers, traced back to the argument through casts,
scalar scales, transposes and a head repeat. The reference is then traced again as a function of the
three in ``[batch, heads, seq, head_dim]`` order (and its other arguments after them), its output moved to
the same order, which is the program the flash template matches; the candidate's wrapper moves the
arguments and the output with the same permutations, which XLA does as copies around the kernel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from maxkernel.analysis.program import Const, Program, ProgramBuilder, Var, arg_names, input_shapes, size_names, static_args
from maxkernel.templates.attention_tail import split_after_attention

if TYPE_CHECKING:
    from jaxbench.task import Task

SAME_SHAPE = ("convert_element_type", "copy", "reduce_precision")
SCALED = ("mul", "div")


@dataclass(frozen=True)
class Layout:
    """Where the flash kernel's operands are among the reference's arguments, and how their axes lie."""

    order: tuple[int, ...]  # argument indices: queries, keys, values, then the others in their order
    perms: tuple[tuple[int, ...], ...]  # per queries, keys, values: their axes as (batch, heads, seq, head_dim)
    out_perm: tuple[int, ...]  # the reference's output axes, as axes of the (batch, heads, seq, dim) result
    # (-1: an axis of length one the attention is mapped over, as ``jax.vmap`` over a batch of one writes it)
    units: tuple[int | None, ...] = (None, None, None)  # per queries, keys, values: that axis, if they have one

    @property
    def identity(self) -> bool:
        return (self.order == tuple(range(len(self.order))) and not any(self.moves(slot) for slot in range(3))
                and self.out_perm == (0, 1, 2, 3))

    def moves(self, slot: int) -> bool:
        """Whether the role's argument is moved (transposed, or its unit axis dropped) for the kernel."""
        return self.perms[slot] != (0, 1, 2, 3) or self.units[slot] is not None

    def kept_perm(self, slot: int) -> tuple[int, ...]:
        """The role's argument axes in the kernel's order, its unit axis dropped (numbered as after dropping
        it) and an inserted heads axis (-1: batch and heads merged in the argument) left out."""
        unit = self.units[slot]
        return tuple(a - (unit is not None and a > unit) for a in self.perms[slot] if a >= 0)

    def inserted(self, slot: int) -> int | None:
        """The kernel's axis the role's argument lacks (its heads, merged into the batch), if any."""
        return self.perms[slot].index(-1) if -1 in self.perms[slot] else None

    def missing_out(self) -> tuple[int, ...]:
        """The kernel's output axes the reference's output lacks (heads merged back into the batch)."""
        return tuple(a for a in range(4) if a not in self.out_perm)


def _source_axes(program: Program, operand: Any, source: Var) -> list[int] | None:
    """For each axis of ``operand``, the axis of the argument ``source`` it is, through casts, scalar
    scales, transposes and a head repeat (a broadcast that adds an axis right after one, merged back into
    it by a reshape, as ``jnp.repeat`` writes it); None when the path holds anything else."""
    producers = program.producers()
    if not isinstance(operand, Var):
        return None
    axes = list(range(len(operand.shape)))
    var = operand
    while var is not source:
        node = producers.get(var)
        if node is None:
            return None
        if node.prim in SAME_SHAPE:
            var = node.ins[0]  # type: ignore[assignment]
        elif node.prim in SCALED and any(isinstance(op, Const) and op.scalar() is not None for op in node.ins):
            var = next(op for op in node.ins if isinstance(op, Var))
            if tuple(var.shape) != tuple(node.out.shape):
                return None
        elif node.prim == "transpose":
            perm = [int(p) for p in node.params["permutation"]]
            axes = [perm[a] for a in axes]
            var = node.ins[0]  # type: ignore[assignment]
        elif node.prim == "reshape" and isinstance(node.ins[0], Var) and _split_axis(node) is not None:
            at = _split_axis(node)  # output axes at and at + 1 are input axis at (a merged batch and heads)
            axes = [a if a <= at else a - 1 for a in axes]
            var = node.ins[0]
        elif node.prim == "reshape" and isinstance(node.ins[0], Var) and node.ins[0] in producers:
            widened = producers[node.ins[0]]
            merged = repeat_axis(widened, node)
            if merged is None:
                return None
            dims = [int(d) for d in widened.params["broadcast_dimensions"]]
            # output axis j is the widened axis j (before the merge) or j + 1 (after it)
            axes = [dims.index(a if a <= merged else a + 1) for a in axes]
            var = widened.ins[0]  # type: ignore[assignment]
        else:
            return None
        if not isinstance(var, Var):
            return None
    return axes


def _split_axis(reshape: Any) -> int | None:
    """The input axis a reshape splits into two consecutive output axes (every other axis kept), else None."""
    if reshape.params.get("dimensions") is not None:
        return None
    src, out = [int(d) for d in reshape.ins[0].shape], [int(d) for d in reshape.out.shape]
    if len(out) != len(src) + 1:
        return None
    at = next((i for i in range(len(src)) if out[i] != src[i]), len(src) - 1)
    fits = out[:at] == src[:at] and out[at] * out[at + 1] == src[at] and out[at + 2:] == src[at + 1:]
    return at if fits else None


def repeat_axis(widened: Any, reshape: Any) -> int | None:
    """The axis ``jnp.repeat`` widened (a new axis right after it, merged back by ``reshape``), else None."""
    if widened.prim != "broadcast_in_dim" or not isinstance(widened.ins[0], Var):
        return None
    dims = [int(d) for d in widened.params["broadcast_dimensions"]]
    wide = [int(d) for d in widened.params["shape"]]
    if len(wide) != len(dims) + 1 or dims != sorted(dims):
        return None
    new = next(i for i in range(len(wide)) if i not in dims)
    if new == 0:
        return None
    merged = new - 1
    expected = wide[:merged] + [wide[merged] * wide[new]] + wide[new + 1:]
    if [int(d) for d in reshape.out.shape] != expected or int(widened.ins[0].shape[dims.index(merged)]) != wide[merged]:
        return None
    return merged


def find_layout(program: Program) -> Layout | str:
    """The roles and axes of an attention's arguments, by data flow, or why they cannot be read."""
    dots = [n for n in program.nodes if n.prim == "dot_general"]
    if len(dots) != 2:
        return "not two matmuls (scores, then scores times values)"
    scores, values = dots

    def single(op: Any) -> int | None:
        names = program.reads(op) if isinstance(op, Var) else set()
        return next((i for i, v in enumerate(program.inputs) if {v.name} == names), None)

    side = [isinstance(op, Var) and scores in program.ancestors(op) for op in values.ins]
    if side.count(True) != 1:
        return "the second matmul does not read the scores on one side"
    at = side.index(True)  # the scores' side of the second matmul; the values are the other
    iq, ik = single(scores.ins[0]), single(scores.ins[1])
    iv = single(values.ins[1 - at])
    if iq is None or ik is None or iv is None or len({iq, ik, iv}) < 3:
        return "queries, keys and values are not three arguments the two matmuls read one each"
    q, k, v = (program.inputs[i] for i in (iq, ik, iv))
    rank = len(q.shape)
    merged = rank == 3  # [batch * heads, seq, head_dim], split inside the reference
    rank = 4 if merged else rank
    if rank not in (4, 5) or any(len(x.shape) != len(q.shape) for x in (k, v)):
        return "queries, keys and values are not four-dimensional (or five, with an axis of one mapped over)"
    (lc, rc), (lb, rb) = scores.params["dimension_numbers"]
    contracted, batched = values.params["dimension_numbers"]
    pc, vc, pb, vb = contracted[at], contracted[1 - at], batched[at], batched[1 - at]
    if len(lb) != rank - 2 or len(lc) != 1 or len(pb) != rank - 2 or len(pc) != 1:
        return "matmuls that are not batched over two axes with one contracted"
    if tuple(pb) != tuple(range(rank - 2)) or tuple(pc) != (rank - 1,) or len(values.ins[at].shape) != rank:
        return "the second matmul does not contract the scores' key axis"
    qa, ka, va = (_source_axes(program, op, x) for op, x in ((scores.ins[0], q), (scores.ins[1], k), (values.ins[1 - at], v)))
    if qa is None or ka is None or va is None:
        return "something other than casts, scales, transposes and a head repeat between an argument and its matmul"
    mapped = None  # the batch position (of the three) that is an axis of one in every role: jax.vmap over it
    if rank == 5:
        mapped = next((i for i in range(3) if int(q.shape[qa[lb[i]]]) == int(k.shape[ka[rb[i]]])
                       == int(v.shape[va[vb[i]]]) == 1), None)
        if mapped is None:
            return "five-dimensional queries, keys and values with no axis of one to map over"
    units = (None, None, None) if mapped is None else (qa[lb[mapped]], ka[rb[mapped]], va[vb[mapped]])
    lb, rb, vb = ([d for i, d in enumerate(dims) if i != mapped] for dims in (lb, rb, vb))

    def free(batch: Any, contracted: Any, unit: int | None, axes: list[int]) -> int:
        return next(a for a in range(rank) if a not in tuple(batch) + tuple(contracted) and axes[a] != unit)

    perms = [[qa[lb[0]], qa[lb[1]], qa[free(lb, lc, units[0], qa)], qa[lc[0]]],
             [ka[rb[0]], ka[rb[1]], ka[free(rb, rc, units[1], ka)], ka[rc[0]]],
             [va[vb[0]], va[vb[1]], va[vc[0]], va[free(vb, vc, units[2], va)]]]
    if merged:  # the batch and heads are one axis of the argument: the kernel's heads axis is inserted (-1)
        if any(p[0] != p[1] or len(set(p[1:])) != 3 for p in perms):
            return "three-dimensional queries, keys and values whose first axis is not batch and heads merged"
        perms = [[p[0], -1, p[2], p[3]] for p in perms]
    if not merged and int(k.shape[perms[1][0]]) < int(q.shape[perms[0][0]]):  # the keys' heads: fewer of them
        perms = [[p[1], p[0], p[2], p[3]] for p in perms]
    # the second matmul writes (batch, heads) then its left operand's free axis, then its right one's
    after = split_after_attention(program)  # an elementwise tail (an output gate) follows the attention's result
    end = after[0] if not isinstance(after, str) and after[1] is not None else None
    # the second matmul writes its batch axes (the mapped one: -1), then its left operand's free axis, then its right one's
    written = [0, 1, 2, 3] if at == 0 else [0, 1, 3, 2]
    if mapped is not None:
        written.insert(mapped, -1)
    out = _output_perm(program, values.out, written, end, merged)
    if out is None:
        return "something other than casts, scalings and transposes between the attention and the output"
    order = (iq, ik, iv) + tuple(i for i in range(len(program.inputs)) if i not in (iq, ik, iv))
    return Layout(order, tuple(tuple(p) for p in perms), out, units)


def _output_perm(program: Program, start: Var, perm: list[int], end: Var | None = None,
                 merged: bool = False) -> tuple[int, ...] | None:
    """The reference's output axes as axes of the (batch, heads, seq, dim) result, where ``perm`` says that
    of ``start`` (its shape kept up to transposes on the way to the output, or to ``end``, the attention's
    result where an elementwise tail follows it)."""
    if len(program.outputs) != 1 or not isinstance(program.outputs[0], Var):
        return None
    users = program.users()
    var = start
    while var is not (end if end is not None else program.outputs[0]):
        readers = users.get(var, [])
        if len(readers) != 1:
            return None
        node = readers[0]
        if node.prim == "transpose":
            perm = [perm[int(p)] for p in node.params["permutation"]]
        elif merged and node.prim == "reshape" and 1 in perm and _merges(node, perm.index(1) - 1) \
                and perm[perm.index(1) - 1] == 0:
            perm.pop(perm.index(1))  # batch and heads merged back: the kernel's inserted heads axis leaves
        elif tuple(node.out.shape) != tuple(var.shape) or len(node.outs) != 1:
            return None
        var = node.out
    return tuple(perm)


def _merges(reshape: Any, at: int) -> bool:
    """Whether a reshape merges input axes ``at`` and ``at + 1`` into one (every other axis kept)."""
    src, out = [int(d) for d in reshape.ins[0].shape], [int(d) for d in reshape.out.shape]
    return at >= 0 and len(out) == len(src) - 1 and out[:at] == src[:at] and out[at] == src[at] * src[at + 1] \
        and out[at + 1:] == src[at + 2:]


def canonical_program(task: "Task", size: str, layout: Layout) -> Program:
    """The reference traced as a function of queries, keys and values in ``[batch, heads, seq, head_dim]``
    order (then its other arguments), with its output in that order."""
    static = static_args(task, size)
    shapes = list(input_shapes(task, size))
    names = arg_names(task)
    inverse = [tuple(int(a) for a in np.argsort(layout.kept_perm(slot))) for slot in range(3)]
    out_unit = layout.out_perm.index(-1) if -1 in layout.out_perm else None
    labels = [a for a in layout.out_perm if a >= 0] + list(layout.missing_out())

    def canonical(*moved: Any) -> Any:
        args: list[Any] = [None] * len(shapes)
        for slot, position in enumerate(layout.order):
            if slot < 3:
                arg = moved[slot]
                at = layout.inserted(slot)
                if at is not None:  # a reshape, which the matchers read through as they do the reference's own
                    arg = arg.reshape(tuple(d for i, d in enumerate(arg.shape) if i != at))
                arg = jnp.transpose(arg, inverse[slot])
                args[position] = arg if layout.units[slot] is None else jnp.expand_dims(arg, layout.units[slot])
            else:
                args[position] = moved[slot]
        out = task.reference(*args, **static)
        out = out if out_unit is None else jnp.squeeze(out, out_unit)
        out = out.reshape(*out.shape, *([1] * len(layout.missing_out())))
        return jnp.transpose(out, tuple(int(a) for a in np.argsort(labels)))

    specs = []
    for slot, position in enumerate(layout.order):
        s = shapes[position]
        specs.append(jax.ShapeDtypeStruct(tuple(1 if a < 0 else s.shape[a] for a in layout.perms[slot]), s.dtype)
                     if slot < 3 else s)
    closed = jax.make_jaxpr(canonical)(*specs)
    program = ProgramBuilder().build(closed, [names[p] for p in layout.order])
    program.out_tree = jax.tree_util.tree_structure(0)
    program.dim_names = size_names(task.size(size) if size in task.spec.sizes else {}, names)
    return program


def wrapper_source(names: list[str], layout: Layout, static: tuple[str, ...], entry: str) -> str:
    """``kernel``: the reference's arguments in its own order and layout, moved for ``entry`` and back."""
    keywords = "".join(f", {s}" for s in static)
    passed = "".join(f", {s}={s}" for s in static)
    lines = [f"def kernel({', '.join(names)}{', *' + keywords if static else ''}):",
             '    """The arguments moved to (batch, heads, seq, head_dim) for the kernel, its output moved back to '
             'the reference\'s layout."""']
    moved = []
    for slot in range(3):
        name = names[layout.order[slot]]
        if not layout.moves(slot):
            moved.append(name)
            continue
        unit = layout.units[slot]
        source = name if unit is None else f"jnp.squeeze({name}, {unit})"  # the axis of one mapped over
        perm = layout.kept_perm(slot)
        source = f"jnp.transpose({source}, {perm})" if perm != tuple(range(len(perm))) else source
        if layout.inserted(slot) is not None:  # batch and heads merged: the heads axis, of one, for the kernel
            source = f"jnp.expand_dims({source}, {layout.inserted(slot)})"
        lines.append(f"    {name}_bhsd = {source}")
        moved.append(f"{name}_bhsd")
    rest = [names[p] for p in layout.order[3:]]
    result = f"{entry}({', '.join(moved + rest)}{passed})"
    missing = layout.missing_out()
    if missing:
        result = f"jnp.squeeze({result}, {missing if len(missing) > 1 else missing[0]})"
    remaining = [a for a in range(4) if a not in missing]
    order = tuple(remaining.index(a) for a in layout.out_perm if a >= 0)
    if order != tuple(range(len(order))):
        result = f"jnp.transpose({result}, {order})"
    if -1 in layout.out_perm:
        result = f"jnp.expand_dims({result}, {layout.out_perm.index(-1)})"
    lines.append(f"    return {result}")
    return "\n".join(lines) + "\n"
