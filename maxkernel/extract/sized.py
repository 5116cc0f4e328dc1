"""Region code that runs at every size of the layer: a dimension no argument of the region has (the heads a
projection is split into, the group a kv head is repeated for) is written as the layer's integer size
parameters (``heads``, ``heads // kv_heads``) where that expression gives its extent at every size the
layer was traced at, so the function emitted at ``full`` is also the layer's code at smaller widths."""

from __future__ import annotations

from itertools import permutations
from typing import Any

from maxkernel.analysis.program import Program
from maxkernel.rewrites.emit import Emitter

LITERAL = None


class SizedEmitter(Emitter):
    """Records the extent behind every dimension no input names, and writes the chosen expression for it."""

    def __init__(self, program: Program, choices: list[str | None] | None = None) -> None:
        super().__init__(program, size_names=True, rename_inputs=True)
        self.choices = choices
        self.extents: list[int] = []
        self.used_statics: set[str] = set()

    def dim(self, size: int) -> str:
        if size in self.dims:
            return super().dim(size)
        call = len(self.extents)
        self.extents.append(size)
        choice = self.choices[call] if self.choices is not None and call < len(self.choices) else LITERAL
        if choice is None:
            return str(size)
        self.used_statics.update(part for part in choice.split() if part.isidentifier())
        return choice


def integer_statics(static: dict[str, Any]) -> dict[str, int]:
    """The layer's static arguments that are size parameters (integers above 1)."""
    return {k: v for k, v in static.items() if isinstance(v, int) and not isinstance(v, bool) and v > 1}


def choose(extents: dict[str, list[int]], statics: dict[str, dict[str, int]]) -> list[str | None] | None:
    """For each recorded dimension, the one expression of the statics (a name, a quotient or a product of
    two) that gives its extent at every size; None where none or several do. None overall when the sizes'
    programs do not read their dimensions alike (their records differ in length)."""
    sizes = list(extents)
    if len({len(extents[s]) for s in sizes}) != 1:
        return None
    names = sorted(set.intersection(*(set(statics[s]) for s in sizes))) if sizes else []
    candidates: list[tuple[str, Any]] = [(n, lambda v, n=n: v[n]) for n in names]
    candidates += [(f"{a} // {b}", lambda v, a=a, b=b: v[a] // v[b] if v[a] % v[b] == 0 else None)
                   for a, b in permutations(names, 2)]
    candidates += [(f"{a} * {b}", lambda v, a=a, b=b: v[a] * v[b]) for a, b in permutations(names, 2) if a < b]
    choices: list[str | None] = []
    for call in range(len(extents[sizes[0]]) if sizes else 0):
        fits = [text for text, value in candidates
                if all(extents[s][call] > 1 and value(statics[s]) == extents[s][call] for s in sizes)]
        direct = [t for t in fits if t.isidentifier()]  # a size parameter itself before any combination
        fits = direct or fits
        choices.append(fits[0] if len(fits) == 1 else None)
    return choices


def emit_sized(program: Program, name: str, doc: str, choices: list[str | None] | None) -> tuple[str, set[str]]:
    """``def name(inputs..., *, statics):`` with the chosen expressions; the statics it reads."""
    em = SizedEmitter(program, choices)
    body = em.body()
    returns = em.returns()
    params = ", ".join(em.name(v) for v in program.inputs)
    used = sorted(em.used_statics)
    head = f"def {name}({params}{', *, ' + ', '.join(used) if used else ''}):"
    return "\n".join([head, f'    """{doc}"""', *body, f"    return {returns}"]), set(used)


def record(program: Program) -> list[int]:
    """The extents of the dimensions no input of ``program`` names, in the order the emitter writes them."""
    em = SizedEmitter(program)
    em.body()
    return em.extents
