"""A reference cut around one part a kernel computes: the reference's own code before that part and after
it, emitted as functions XLA runs, and the kernel in the part's place.

An expert sketch reads a structure (an attention core, a step-by-step scan) wherever it sits in a program:
the values the part reads become the kernel's operands (``before`` computes them from the task's inputs,
with whatever the rest of the program still needs), and ``after`` computes the task's outputs from the
kernel's results. Each size's code is emitted once where one function serves every size, else once per
size, picked by the arguments' shapes.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from maxkernel.analysis.program import Node, Program, Var
from maxkernel.rewrites.build import splice_traced


@dataclass
class Around:
    """The code before the part (the task's inputs -> its operands, then ``kept``) and after it (the part's
    results, ``kept``, then the task's inputs it reads -> the task's outputs)."""

    before: Program
    after: Program
    after_inputs: tuple[int, ...]  # the task's inputs ``after`` reads, by index
    kept: int


# Values that reach a float32 product through these keep what they were (a bfloat16 weight widened, then
# reshaped, is still exact in bfloat16).
_SAME_VALUES = ("reshape", "transpose", "broadcast_in_dim", "squeeze", "expand_dims", "slice", "copy", "copy_p")
# Types whose every value is exact in bfloat16 (an int8 weight too: 8 bits of mantissa hold -128...127).
_EXACT_IN_BF16 = ("bfloat16", "int8", "uint8", "bool")


def _exact_in_bf16(value: Var, made_by: dict[int, Node]) -> bool:
    """Whether every element of ``value`` is a bfloat16 number: it is one, or a widening of one, moved."""
    while True:
        if np.dtype(value.dtype).name in _EXACT_IN_BF16:
            return True
        node = made_by.get(id(value))
        if node is None or not node.ins or not isinstance(node.ins[0], Var):
            return False
        if node.prim not in (*_SAME_VALUES, "convert_element_type"):
            return False
        value = node.ins[0]


def _split_product(dims: Any, out_dtype: Any, exact: tuple[bool, bool], levels: int) -> Callable[[Any, Any], Any]:
    """A float32 product as bfloat16 MXU passes: each operand not exact in bfloat16 as ``levels`` bfloat16
    parts (high, then what is left, ...), and the products of parts whose levels sum below ``levels`` (the
    rest is below float32 rounding): with two levels three products (two beside a widened weight), with
    three six (three beside it), as XLA's ``HIGH`` and ``HIGHEST`` are on a TPU."""
    def parts(t: Any, is_exact: bool) -> list[Any]:
        found = [t.astype(jnp.bfloat16)]
        for _ in range(0 if is_exact else levels - 1):
            t = t - found[-1].astype(jnp.float32)
            found.append(t.astype(jnp.bfloat16))
        return found

    def product(a: Any, b: Any) -> Any:
        dot = functools.partial(jax.lax.dot_general, dimension_numbers=dims, preferred_element_type=jnp.float32)
        terms = [dot(x, y) for i, x in enumerate(parts(a, exact[0])) for j, y in enumerate(parts(b, exact[1]))
                 if i + j < levels]
        return functools.reduce(lambda s, t: s + t, terms).astype(out_dtype)

    return product


def with_passes(program: Program, passes: int) -> Program:
    """``program`` with its float32 products as precise as the task needs (``passes``: what its tolerance
    admits, :func:`maxkernel.analysis.precision.kernel_passes`): XLA runs the code around a kernel, and on a
    TPU a float32 product at the default precision rounds its operands to bfloat16, as the evaluator's TPU
    numerics do. A product of two values exact in bfloat16 (stored bfloat16, widened) is exact in one pass
    and is left as written; any other is written as bfloat16 products of its operands' parts
    (:func:`_split_product`; two levels for three passes, three for six). Written out, they are what XLA:TPU
    prices: its cost analysis gives a float32 product the same time at every precision."""
    if passes <= 1:
        return program
    copy = dataclasses.replace(program, nodes=[dataclasses.replace(n) for n in program.nodes],
                               outputs=list(program.outputs))
    made_by = {id(o): n for n in copy.nodes for o in n.outs}
    for node in list(copy.nodes):
        if node.prim != "dot_general" or not all(isinstance(op, Var) and np.dtype(op.dtype) == np.float32 for op in node.ins):
            continue
        if node.params.get("precision") not in (None, (None, None), jax.lax.Precision.DEFAULT,
                                                (jax.lax.Precision.DEFAULT, jax.lax.Precision.DEFAULT)):
            continue
        exact = tuple(_exact_in_bf16(op, made_by) for op in node.ins)  # type: ignore[arg-type]
        if not all(exact):
            splice_traced(copy, node, _split_product(node.params["dimension_numbers"], node.out.dtype, exact,  # type: ignore[arg-type]
                                                     2 if passes <= 3 else 3))
    return copy


def around_with_passes(around: Around, passes: int) -> Around:
    """:func:`with_passes` on both sides of the part."""
    return Around(with_passes(around.before, passes), with_passes(around.after, passes), around.after_inputs, around.kept)


def cut_around(program: Program, start: int, end: int, operands: list[Var], results: list[Var],
               extra: list[Node] | None = None) -> Around | str:
    """``program`` without its nodes ``[start, end)``, which compute ``results`` from ``operands``:
    ``before`` runs the nodes before them (and ``extra``, nodes made to move an operand), ``after`` the nodes
    after them. Refused when the rest reads a value made inside the part other than its results."""
    inside = {id(o) for n in program.nodes[start:end] for o in n.outs} - {id(r) for r in results}
    rest = program.nodes[end:]
    if any(isinstance(op, Var) and id(op) in inside for n in rest for op in n.ins) or \
            any(isinstance(o, Var) and id(o) in inside for o in program.outputs):
        return "the rest of the reference reads a value made inside the part"
    made_before = {id(o) for n in program.nodes[:start] for o in n.outs}
    inputs = {id(v): i for i, v in enumerate(program.inputs)}
    kept: list[Var] = []
    after_inputs: list[int] = []
    for op in [op for n in rest for op in n.ins] + list(program.outputs):
        if not isinstance(op, Var) or any(op is r for r in results):
            continue
        if id(op) in made_before and all(op is not k for k in kept):
            kept.append(op)
        elif id(op) in inputs and inputs[id(op)] not in after_inputs:
            after_inputs.append(inputs[id(op)])
    frontier = [*operands, *kept]
    before = Program(list(program.inputs), [*program.nodes[:start], *(extra or [])], frontier, None,
                     program._counter, dict(program.dim_names)).dce()
    before.out_tree = jax.tree_util.tree_structure(tuple(range(len(frontier))))
    after = Program([*results, *kept, *(program.inputs[i] for i in after_inputs)], list(rest),
                    list(program.outputs), program.out_tree)
    return Around(before, after, tuple(after_inputs), len(kept))


def stage(programs: dict[str, Program], name: str, doc: str, integers: dict[str, dict[str, int]] | None = None,
          probes: list[tuple[Program, dict[str, int]]] | None = None) -> tuple[str, dict[str, str]]:
    """``name``: one function for every size where one serves them all, else one per size (``name_size``);
    the source and each size's function name. With each size's ``integers`` (the task's integer statics),
    an extent may be read from them too (the heads of a reshape), and the reference's statics the shared
    function reads are its keyword-only arguments; ``probes`` (programs at sizes traced to tell coincidences
    apart, with their integer statics) take part in choosing what each extent is read from."""
    from maxkernel.rewrites.emit import emit_function
    from maxkernel.rewrites.sized import emit_every_size

    shared = None
    if len(programs) > 1:
        shared = emit_every_size(list(programs.values()), name, doc, statics=integers is not None,
                                 integers=None if integers is None else [integers[size] for size in programs],
                                 probes=probes)
    else:
        shared = emit_function(next(iter(programs.values())), name, doc)
    if shared is not None:
        return shared, {size: name for size in programs}
    texts = [emit_function(program, f"{name}_{size}", doc) for size, program in programs.items()]
    return "\n\n\n".join(texts), {size: f"{name}_{size}" for size in programs}


def around_source(cuts: dict[str, Around], names: list[str], call: list[str], what: str,
                  statics: bool = False, integers: dict[str, dict[str, int]] | None = None,
                  probes: list[tuple[Around, dict[str, int]]] | None = None) -> str:
    """The stages before and after the part, and ``kernel``: the lines of ``call`` (which call ``_before``
    on the reference's arguments, unpacking ``*kept`` after the operands, run the kernel and set
    ``result``), then ``_after``. With each size's integer statics (``integers``; ``kernel`` then takes the
    reference's statics), the stages are one function for every size wherever the extents that change
    between sizes follow the arguments' shapes or those statics (``probes``: the cut at sizes traced only to
    tell an extent from another of the same value, with their integer statics)."""
    first = next(iter(cuts.values()))
    before, before_fns = stage({size: c.before for size, c in cuts.items()}, "_before",
                               f"The reference's own code up to {what}: its operands, then what the rest reads.", integers,
                               [(c.before, ints) for c, ints in probes or []])
    after, after_fns = stage({size: c.after for size, c in cuts.items()}, "_after",
                             f"The reference's own code after {what}, from its result.", integers,
                             [(c.after, ints) for c, ints in probes or []])
    lines = [before, "", "", after, "", ""]
    shared = len(set(before_fns.values())) == 1 and len(set(after_fns.values())) == 1
    if not shared:
        served = [tuple(tuple(v.shape) for v in cuts[size].before.inputs) for size in cuts]
        lines += ["def _stages(shapes):", '    """Each size\'s code before and after the kernel, by the arguments\' shapes."""']
        for size, shapes in zip(cuts, served):
            lines += [f"    if shapes == {shapes}:", f"        return {before_fns[size]}, {after_fns[size]}"]
        lines += [f"    raise ValueError(f'serves argument shapes {served} only, not {{shapes}}')", "", ""]

    def passed(text: str) -> str:  # the statics a shared stage reads, from kernel's own
        from maxkernel.rewrites.sized import keywords

        return "".join(f", {n}=static[{n!r}]" for n in keywords(text)) if shared else ""

    plain = f"_before({', '.join(names)})"
    call = [line.replace(plain, f"_before({', '.join(names)}{passed(before)})") for line in call]
    rest = ", ".join(["*kept", *(names[i] for i in first.after_inputs)])
    lines += [f"def kernel({', '.join(names)}{', **static' if statics or integers is not None else ''}):",
              f'    """Before {what} (XLA), the kernel, after it (XLA)."""',
              *([] if shared else [f"    _before, _after = _stages(tuple(a.shape for a in ({', '.join(names)},)))"]),
              *(f"    {line}" for line in call),
              f"    return _after(result, {rest}{passed(after)})", ""]
    return "\n".join(lines)
