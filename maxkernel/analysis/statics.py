"""Which literals of a traced reference are its numeric static arguments.

Tracing folds a static such as ``scaling_factor=1.5`` into the jaxpr as the literal ``1.5``; code emitted
from that program would hard-code it, and the kernel would be wrong for any other value the caller passes
(the evaluator redraws the statics a task declares, and says so). The reference is traced a second time
with every float static moved by its own factor; a scalar literal that moves with it, as the static itself
or a simple function of it (``1 / s``, ``-s``, ``sqrt(s)``), is marked with that static on its
:class:`~maxkernel.analysis.program.Const`, so emitters that take statics as arguments write the name.
A literal that moves in any other way stays a value: the redrawn-statics check is what finds it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from typing import TYPE_CHECKING, Any, Callable

import jax
import numpy as np

if TYPE_CHECKING:
    from maxkernel.analysis.program import Const, Operand, Program

TRANSFORMS: dict[str, tuple[Callable[[float], float], str]] = {
    "same": (lambda v: v, "{}"),
    "neg": (lambda v: -v, "-{}"),
    "recip": (lambda v: 1.0 / v, "1 / {}"),
    "sqrt": (lambda v: math.sqrt(v), "{} ** 0.5"),
    "rsqrt": (lambda v: 1.0 / math.sqrt(v), "1 / {} ** 0.5"),
    "square": (lambda v: v * v, "{} ** 2"),
}
"""How a static may reach a literal, in the order tried, and how each is written."""


def float_statics(static: dict[str, Any]) -> dict[str, float]:
    """The static arguments that are Python floats (integers are sizes and counts: they move shapes)."""
    return {k: float(v) for k, v in static.items()
            if isinstance(v, float) and math.isfinite(v) and k.isidentifier()}


def moved(static: dict[str, float]) -> dict[str, float]:
    """Every float static moved by its own factor (none shares another's), zero moved off zero."""
    return {name: value * (1.3 + 0.1 * i) if value else 0.25 * (i + 1)
            for i, (name, value) in enumerate(sorted(static.items()))}


def static_text(key: tuple[str, str]) -> str:
    """The source for a marked literal: ``scaling_factor``, ``1 / divisor``."""
    name, transform = key
    return TRANSFORMS[transform][1].format(name)


def _value(transform: str, value: float, dtype: np.dtype) -> float | None:
    try:
        with np.errstate(all="ignore"):
            return float(np.asarray(TRANSFORMS[transform][0](value), dtype))
    except (ValueError, ZeroDivisionError, OverflowError):
        return None


def _which(base: float, other: float, dtype: np.dtype, statics: dict[str, float],
           shifted: dict[str, float]) -> tuple[str, str] | None:
    """The (static, transform) that gives the literal's value in both traces, or None."""
    for transform in TRANSFORMS:
        for name, value in statics.items():
            if _value(transform, value, dtype) == base and _value(transform, shifted[name], dtype) == other:
                return name, transform
    return None


def _scalar(op: "Operand") -> bool:
    from maxkernel.analysis.program import Const

    if not isinstance(op, Const) or op.shape:
        return False
    dtype = np.dtype(op.dtype)
    return bool(np.issubdtype(dtype, np.floating))


def mark_statics(program: "Program", reference: Callable[..., Any], static: dict[str, Any], shapes: list[Any],
                 names: list[str]) -> int:
    """Mark the literals of ``program`` that are float statics (see the module doc); how many were marked.
    Nothing is marked when the reference has no float static, when moving them changes the program's
    structure (a static that picks a branch in Python is a specialization, not a value: seen when the
    moved value takes the other branch; a branch it does not flip stays unseen, and the redrawn statics
    are what catch a kernel written without it), or when any literal moves in a way no transform explains
    (a half-named program would be wrong all the same)."""
    from maxkernel.analysis.program import Const, ProgramBuilder

    statics = float_statics(static)
    if not statics:
        return 0
    shifted = moved(statics)
    try:
        closed = jax.make_jaxpr(functools.partial(reference, **{**static, **shifted}))(*shapes)
    except Exception:  # a moved value the reference refuses: its literals stay values
        return 0
    other = ProgramBuilder().build(closed, names)
    if [n.prim for n in other.nodes] != [n.prim for n in program.nodes] or len(other.outputs) != len(program.outputs):
        return 0
    found: dict[tuple[int, int], tuple[str, str]] = {}  # (node, operand) -> its static; node -1: the outputs
    pairs = [(i, n.ins, t.ins) for i, (n, t) in enumerate(zip(program.nodes, other.nodes))]
    for i, ins, twins in [*pairs, (-1, program.outputs, other.outputs)]:
        if len(ins) != len(twins):
            return 0
        for j, (a, b) in enumerate(zip(ins, twins)):
            if not isinstance(a, Const) or not isinstance(b, Const):
                continue
            if a.shape == b.shape and np.array_equal(np.asarray(a.value), np.asarray(b.value)):
                continue
            key = _fit(a, b, statics, shifted)
            if key is None:  # the static reaches this literal some other way: the program is a specialization
                return 0
            found[(i, j)] = key
    for (i, j), key in found.items():
        ops = program.outputs if i < 0 else program.nodes[i].ins
        ops[j] = dataclasses.replace(ops[j], static=key)
    return len(found)


def _fit(a: "Const", b: "Const", statics: dict[str, float], shifted: dict[str, float]) -> tuple[str, str] | None:
    """The (static, transform) of a scalar float literal that differs between the two traces, else None."""
    if not (_scalar(a) and _scalar(b)) or np.dtype(a.dtype) != np.dtype(b.dtype):
        return None
    x, y = float(np.asarray(a.value)), float(np.asarray(b.value))
    if not (math.isfinite(x) and math.isfinite(y)):
        return None
    return _which(x, y, np.dtype(a.dtype), statics, shifted)


def used_statics(program: "Program") -> list[str]:
    """The statics the program's marked literals read, sorted (the emitted function's keyword arguments)."""
    from maxkernel.analysis.program import Const

    found = {op.static[0] for node in program.nodes for op in node.ins if isinstance(op, Const) and op.static}
    found |= {op.static[0] for op in program.outputs if isinstance(op, Const) and op.static}
    return sorted(found)


def bind(names: list[str], source: str = "static") -> str:
    """Keyword arguments passing the named statics on from ``kernel``'s ``**static``."""
    return ", ".join(f"{name}={source}[{name!r}]" for name in names)


def keyword_only(names: list[str]) -> str:
    """``, *, a, b`` for a signature that takes the statics by name (empty without any)."""
    return f", *, {', '.join(names)}" if names else ""


def passed_on(names: list[str]) -> str:
    """``, a=a, b=b`` for a call that passes the statics it was given on (empty without any)."""
    return "".join(f", {name}={name}" for name in names)


def header_statics(text: str, name: str) -> list[str]:
    """The statics an emitted ``def name(...)`` in ``text`` takes by keyword (its ``*, a, b``), else []."""
    found = re.search(rf"^def {re.escape(name)}\((.*)\):$", text, re.M)
    if found is None or "*, " not in found.group(1):
        return []
    return [part.strip() for part in found.group(1).split("*, ", 1)[1].split(",")]
