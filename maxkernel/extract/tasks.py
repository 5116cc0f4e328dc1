"""Writing a region as a task folder: plain JAX emitted from the layer's program at ``full``, serving every size.

The folder holds ``task.yaml`` and ``reference.py``. The region's ``get_inputs`` draws the layer's inputs with
the layer's own ``get_inputs`` (its code is carried in the file under a ``_layer_`` prefix) and runs the
layer up to the region, so a kernel is tested on the values it will really see inside the layer. The file
imports nothing but what the layer's reference does, so the region's reference is itself a sound candidate
(the baseline every region session judges first).
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import yaml

from maxkernel.analysis.program import Program
from maxkernel.extract.names import namespaced
from maxkernel.rewrites.sized import choose, emit_sized, record
from maxkernel.rewrites.emit import emit_function

CATEGORY = {"attention": "attention", "matmul": "matmul", "experts": "moe", "norm": "normalization",
            "routing": "moe", "scan": "recurrence", "conv": "conv", "elementwise": "elementwise"}

_HEADER = '''"""{doc}

Written by ``maxkernel extract`` from {layer}: plain JAX emitted from the layer's program at ``full``, its
shapes read from its arguments and extents no argument has from the layer's size parameters, so the same
function serves every size; a size whose own program is written otherwise has a function of its own, picked
by the arguments' shapes. ``get_inputs`` draws the layer's inputs and runs the layer up to this region, at
the sizes the layer was traced at.
"""

{imports}

'''

_FOOTER = '''

_SIZES = {sizes!r}
_SHAPES = {shapes!r}
_STATICS = {statics!r}


def _size_named(values):
    """The name of the layer size ``values``: the region's inputs are drawn only at sizes it was traced at."""
    for name, known in _SIZES:
        if dict(known) == values:
            return name
    raise ValueError(f"no region inputs for layer size {{values}}")


def _size_of(*args):
    """The size whose own region code these arguments are shaped for, else None (the shared code runs)."""
    shapes = tuple(tuple(a.shape) for a in args)
    for name, known in _SHAPES:
        if known == shapes:
            return name
    return None


def get_inputs(key, **size):
    args, _ = _layer_get_inputs(key, **size)
    return tuple(jax.jit({{{prefix}}}.get(_size_named(size), _inputs))(*args)), {{}}


def _statics_of(*args):
    """The layer's size parameters the shared region code reads, at the size these arguments are shaped for."""
    shapes = tuple(tuple(a.shape) for a in args)
    for known, values in _STATICS:
        if known == shapes:
            return dict(values)
    if {needs_statics!r}:
        raise ValueError(f"no layer size for region argument shapes {{shapes}}")
    return {{}}


def reference({params}):
    own = {{{region}}}.get(_size_of({params}))
    if own is not None:
        return own({params})
    return _region({params}, **_statics_of({params}))
'''

_KEYWORD_FOOTER = '''

_KEYWORDS = {keywords!r}


def get_inputs(key, **size):
    """The region's inputs and the layer's size parameters its code reads (an attention mask's window)."""
    args, _ = _layer_get_inputs(key, **size)
    name = _size_named(size)
    values = next(dict(found) for known, found in _KEYWORDS if known == name)
    return tuple(jax.jit({{{prefix}}}.get(name, _inputs))(*args)), values


def reference({params}, *, {used}):
    own = {{{region}}}.get(_size_of({params}))
    if own is not None:
        return own({params})
    return _region({params}, {passed})
'''


def shared_function(programs: dict[str, Program], name: str, doc: str) -> tuple[str, dict[str, str]]:
    """(``name`` emitted from the ``full`` program, ``{size: its own function}`` for the sizes whose program
    is written otherwise). The emitter reads shapes from the arguments, so ``full``'s code is the code of
    every size at which it is written the same; only the others need a function of their own."""
    shared = emit_function(programs["full"], name, doc)
    own = {}
    for size, program in programs.items():
        if size != "full" and emit_function(program, name, doc) != shared:
            own[size] = emit_function(program, f"{name}_{size}", f"{doc} ({size})")
    return shared, own


def sized_function(programs: dict[str, Program], name: str, doc: str, statics: dict[str, dict[str, int]],
                   probes: dict[str, tuple[Program, dict[str, int]]] | None = None) -> tuple[str, dict[str, str], list[str]]:
    """Like :func:`shared_function`, with every extent written from the input axis or the layer's size
    parameters (``statics``, per size) that give it at every size, the ``probes`` (programs and statics at
    sizes traced only to tell coincidences apart) included (:mod:`.sized`); the shared function takes the
    parameters it reads as keywords (the third item). A size whose code reads otherwise has its own."""
    records = {size: record(program, statics[size]) for size, program in programs.items()}
    evidence = {size: record(program, values) for size, (program, values) in (probes or {}).items()}
    choices = choose(records, evidence)
    shared, used = emit_sized(programs["full"], name, doc, choices)
    own = {size: emit_function(program, f"{name}_{size}", f"{doc} ({size})") for size, program in programs.items()
           if size != "full" and emit_sized(program, name, doc, choices)[0] != shared}
    return shared, own, sorted(used)


def region_source(doc: str, layer_id: str, sizes: dict[str, dict[str, Any]], regions: dict[str, Program],
                  prefixes: dict[str, Program], layer_source: str,
                  statics: dict[str, dict[str, int]] | None = None,
                  probes: dict[str, tuple[Program, dict[str, int]]] | None = None, keywords: bool = False) -> str:
    """The region's ``reference.py``; ``layer_source`` is the layer's reference, whose names it carries
    under the ``_layer_`` prefix; ``statics`` the layer's integer static arguments at each size; ``probes``
    the region's program and statics at sizes traced only to choose how its extents are written.
    ``keywords``: the size parameters the region's code reads are the task's static arguments (an attention
    core's window, which a template must see to recover the mask), not looked up by the arguments' shapes."""
    found, layer_code = namespaced(layer_source, "_layer_")
    imports = ["import jax", "import jax.numpy as jnp", *found]
    parts = [_HEADER.format(doc=doc, layer=layer_id, imports="\n".join(dict.fromkeys(imports)))]
    parts.append("\n# the layer's reference (its get_inputs draws the layer's inputs)\n")
    parts.append("\n\n\n".join(layer_code) + "\n\n\n")
    statics = statics if statics is not None else {size: {} for size in sizes}
    inputs, own_inputs = shared_function(prefixes, "_inputs", "the layer's inputs -> this region's")
    region, own_regions, used = sized_function(regions, "_region", "the region itself", statics, probes)
    parts.append("\n\n".join([inputs, *own_inputs.values(), region, *own_regions.values()]) + "\n\n")
    prefix = ", ".join(f"{s!r}: _inputs_{s}" for s in own_inputs)
    table = ", ".join(f"{s!r}: _region_{s}" for s in own_regions)
    params = ", ".join(parameter_names(regions["full"]))
    shapes = tuple((size, tuple(tuple(v.shape) for v in regions[size].inputs)) for size in own_regions)
    known = tuple((size, tuple(values.items())) for size, values in sizes.items())
    bound = tuple((tuple(tuple(v.shape) for v in regions[size].inputs),
                   tuple((name, statics[size][name]) for name in used)) for size in sizes if size not in own_regions)
    footer = _FOOTER.format(shapes=shapes, sizes=known, prefix=prefix, region=table, params=params, statics=bound,
                            needs_statics=bool(used))
    if keywords and used:
        footer = footer[: footer.index("\n\ndef get_inputs(")] + _KEYWORD_FOOTER.format(
            keywords=tuple((size, tuple((name, statics[size][name]) for name in used)) for size in sizes),
            prefix=prefix, region=table, params=params, used=", ".join(used),
            passed=", ".join(f"{name}={name}" for name in used))
    return "".join(parts).rstrip() + "\n" + footer


def keyword_names(source: str, function: str) -> list[str]:
    """The keyword-only parameters of ``function`` in ``source`` (the layer's size parameters it reads)."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name == function:
            return [a.arg for a in node.args.kwonlyargs]
    return []


def shared_statics(source: str) -> list[str]:
    """The size parameters a region reference's shared ``_region`` takes as keywords."""
    return keyword_names(source, "_region")


def parameter_names(program: Program) -> list[str]:
    """The region's inputs as the reference's parameters: templates name a kernel's arguments after them."""
    names = [v.name for v in program.inputs]
    clash = {"jax", "jnp", "reference", "get_inputs"} | {n for n in names if n.startswith("_")}
    if len(set(names)) != len(names) or any(not n.isidentifier() or n in clash for n in names):
        return [f"a{i}" for i in range(len(names))]
    return names


def write_region_task(folder: Path, *, task_id: str, name: str, kind: str, description: str, dtype: str,
                      tolerance: dict[str, float], source: str, sizes: dict[str, dict[str, Any]]) -> Path:
    """Write one region folder; an existing folder of the same name is replaced."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    spec = {"id": task_id, "name": name, "category": CATEGORY.get(kind, "elementwise"), "description": description,
            "dtype": dtype, "tolerance": tolerance, "sizes": sizes}
    (folder / "task.yaml").write_text(yaml.safe_dump(spec, sort_keys=False, width=110))
    (folder / "reference.py").write_text(source)
    return folder


def float_first(program: Program) -> Program:
    """Put a floating output first: a task's dtype is its first output's."""
    floats = [o for o in program.outputs if jnp.issubdtype(o.dtype, jnp.floating)]
    others = [o for o in program.outputs if o not in floats]
    program.outputs = floats + others
    return program
