"""A reference cut around one part a kernel computes: the reference's own code before that part and after
it, emitted as functions XLA runs, and the kernel in the part's place.

An expert sketch reads a structure (an attention core, a step-by-step scan) wherever it sits in a program:
the values the part reads become the kernel's operands (``before`` computes them from the task's inputs,
with whatever the rest of the program still needs), and ``after`` computes the task's outputs from the
kernel's results. Each size's code is emitted once where one function serves every size, else once per
size, picked by the arguments' shapes.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax

from maxkernel.analysis.program import Node, Program, Var


@dataclass
class Around:
    """The code before the part (the task's inputs -> its operands, then ``kept``) and after it (the part's
    results, ``kept``, then the task's inputs it reads -> the task's outputs)."""

    before: Program
    after: Program
    after_inputs: tuple[int, ...]  # the task's inputs ``after`` reads, by index
    kept: int


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


def stage(programs: dict[str, Program], name: str, doc: str) -> tuple[str, dict[str, str]]:
    """``name``: one function for every size where one serves them all, else one per size (``name_size``);
    the source and each size's function name."""
    from maxkernel.rewrites.emit import emit_function
    from maxkernel.rewrites.sized import emit_every_size

    shared = emit_every_size(list(programs.values()), name, doc) if len(programs) > 1 else \
        emit_function(next(iter(programs.values())), name, doc)
    if shared is not None:
        return shared, {size: name for size in programs}
    texts = [emit_function(program, f"{name}_{size}", doc) for size, program in programs.items()]
    return "\n\n\n".join(texts), {size: f"{name}_{size}" for size in programs}


def around_source(cuts: dict[str, Around], names: list[str], call: list[str], what: str,
                  statics: bool = False) -> str:
    """The stages before and after the part, and ``kernel``: the lines of ``call`` (which call ``_before``
    on the reference's arguments, unpacking ``*kept`` after the operands, run the kernel and set
    ``result``), then ``_after``."""
    first = next(iter(cuts.values()))
    before, before_fns = stage({size: c.before for size, c in cuts.items()}, "_before",
                               f"The reference's own code up to {what}: its operands, then what the rest reads.")
    after, after_fns = stage({size: c.after for size, c in cuts.items()}, "_after",
                             f"The reference's own code after {what}, from its result.")
    lines = [before, "", "", after, "", ""]
    shared = len(set(before_fns.values())) == 1 and len(set(after_fns.values())) == 1
    if not shared:
        served = [tuple(tuple(v.shape) for v in cuts[size].before.inputs) for size in cuts]
        lines += ["def _stages(shapes):", '    """Each size\'s code before and after the kernel, by the arguments\' shapes."""']
        for size, shapes in zip(cuts, served):
            lines += [f"    if shapes == {shapes}:", f"        return {before_fns[size]}, {after_fns[size]}"]
        lines += [f"    raise ValueError(f'serves argument shapes {served} only, not {{shapes}}')", "", ""]
    rest = ", ".join(["*kept", *(names[i] for i in first.after_inputs)])
    lines += [f"def kernel({', '.join(names)}{', **static' if statics else ''}):",
              f'    """Before {what} (XLA), the kernel, after it (XLA)."""',
              *([] if shared else [f"    _before, _after = _stages(tuple(a.shape for a in ({', '.join(names)},)))"]),
              *(f"    {line}" for line in call),
              f"    return _after(result, {rest})", ""]
    return "\n".join(lines)
