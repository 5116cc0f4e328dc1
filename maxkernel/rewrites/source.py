"""Whole candidate files from emitted programs: imports, the computation, and ``kernel``.

Emitted functions read their shapes from their inputs. Each extent is read from the input axes that
give it at every size the candidate was rendered for (``cpu`` for measuring here, ``full`` for TPU
lowering) and at the probe size (``cpu`` with each free parameter moved by its own number of steps,
:func:`maxkernel.analysis.program.probe_sizes`), so a batch of one is read as the batch it is; then the
candidate holds that one function. Where no such function exists, it holds one per rendered size, and
``kernel`` picks a specialization by the argument shapes and serves any other shape with the first one.
"""

from __future__ import annotations

from maxkernel.analysis.program import Program
from maxkernel.analysis.statics import bind, used_statics
from maxkernel.rewrites.emit import EmitError, emit_function
from maxkernel.rewrites.sized import emit_every_size

HEADER = "import jax\nimport jax.numpy as jnp\n"


def size_dispatch(functions: dict[str, tuple[str, tuple[tuple[int, ...], ...]]], params: list[str],
                  otherwise: str | None = None, statics: list[str] | None = None) -> str:
    """``kernel(*args, **static)`` calling the function whose argument shapes match (with the ``statics``
    it reads passed on); any other shape goes to ``otherwise`` when given, else is refused naming the
    shapes served."""
    args = ", ".join(params) + (f", {bind(statics)}" if statics else "")
    lines = [f"def kernel({', '.join(params)}, **static):"]
    items = list(functions.items())
    if len(items) == 1 and (not items[0][1][1] or otherwise is not None):  # no shapes given: it serves any
        name, _ = items[0][1]
        lines.append(f"    return {name}({args})")
        return "\n".join(lines)
    lines.append(f"    shapes = tuple(a.shape for a in ({', '.join(params)},))")
    for _size, (name, shapes) in items:
        lines.append(f"    if shapes == {shapes}:")
        lines.append(f"        return {name}({args})")
    if otherwise is not None:
        lines.append(f"    return {otherwise}({args})")
    else:
        served = [shapes for _size, (_name, shapes) in items]
        lines.append(f"    raise ValueError(f'serves argument shapes {served} only, not {{shapes}}')")
    return "\n".join(lines)


def jax_candidate(programs: dict[str, Program], doc: str, probes: list[Program] | None = None) -> str:
    """A plain-JAX candidate file: one function for every size where one serves them all (``probes``: the
    same computation traced at sizes that only tell coincidences apart), else one emitted function per size."""
    if not programs:
        raise EmitError("no program to emit")
    parts = [f'"""{doc}"""\n', HEADER]
    statics = used_statics(next(iter(programs.values())))  # the same computation at every size reads the same
    shared = emit_every_size([*programs.values(), *(probes or [])], "_computation", statics=True)
    if shared is not None:
        parts.append("\n" + shared + "\n")
        parts.append("\n" + size_dispatch({"any": ("_computation", ())}, [v.name for v in next(iter(programs.values())).inputs],
                                          statics=statics) + "\n")
        return "\n".join(parts)
    functions: dict[str, tuple[str, tuple[tuple[int, ...], ...]]] = {}
    bodies: dict[str, str] = {}
    params: list[str] = []
    for size, program in programs.items():
        bodies[size] = emit_function(program, "_computation", statics=True)
        functions[size] = (f"_computation_{size}", tuple(v.shape for v in program.inputs))
        params = [v.name for v in program.inputs]
    if len(set(bodies.values())) > 1:  # sizes may tell parameters apart differently: name dimensions by axis
        plain = {size: emit_function(program, "_computation", size_names=False, statics=True)
                 for size, program in programs.items()}
        bodies = plain if len(set(plain.values())) == 1 else bodies
    if len(set(bodies.values())) == 1:  # shape-generic: one function serves every size
        parts.append("\n" + next(iter(bodies.values())) + "\n")
        parts.append("\n" + size_dispatch({"any": ("_computation", ())}, params, statics=statics) + "\n")
        return "\n".join(parts)
    first = next(iter(programs))  # it serves every shape no size matches: its extents read as the probes tell
    bodies[first] = emit_every_size([programs[first], *(probes or [])], "_computation", statics=True) or bodies[first]
    for size, body in bodies.items():
        parts.append("\n" + body.replace("def _computation(", f"def _computation_{size}(", 1) + "\n")
    parts.append("\n" + size_dispatch(functions, params, otherwise=next(iter(functions.values()))[0], statics=statics) + "\n")
    return "\n".join(parts)
