"""Whole candidate files from emitted programs: imports, one function per input size, and ``kernel``.

Emitted programs carry their shapes, so a candidate holds one specialization per size it was rendered
for (``cpu`` for measuring here, ``full`` for TPU lowering) and picks one by the argument shapes.
"""

from __future__ import annotations

from maxkernel.analysis.program import Program
from maxkernel.rewrites.emit import EmitError, emit_function

HEADER = "import jax\nimport jax.numpy as jnp\n"


def size_dispatch(functions: dict[str, tuple[str, tuple[tuple[int, ...], ...]]], params: list[str]) -> str:
    """``kernel(*args, **static)`` calling the function whose argument shapes match."""
    args = ", ".join(params)
    lines = [f"def kernel({args}, **static):"]
    items = list(functions.items())
    if len(items) == 1:
        name, _ = items[0][1]
        lines.append(f"    return {name}({args})")
        return "\n".join(lines)
    lines.append(f"    shapes = tuple(a.shape for a in ({args},))")
    for _size, (name, shapes) in items:
        lines.append(f"    if shapes == {shapes}:")
        lines.append(f"        return {name}({args})")
    lines.append("    raise ValueError(f'no specialization for argument shapes {shapes}')")
    return "\n".join(lines)


def jax_candidate(programs: dict[str, Program], doc: str) -> str:
    """A plain-JAX candidate file: one emitted function per size."""
    if not programs:
        raise EmitError("no program to emit")
    parts = [f'"""{doc}"""\n', HEADER]
    functions: dict[str, tuple[str, tuple[tuple[int, ...], ...]]] = {}
    params: list[str] = []
    for size, program in programs.items():
        name = f"_computation_{size}"
        parts.append("\n" + emit_function(program, name) + "\n")
        functions[size] = (name, tuple(v.shape for v in program.inputs))
        params = [v.name for v in program.inputs]
    parts.append("\n" + size_dispatch(functions, params) + "\n")
    return "\n".join(parts)
