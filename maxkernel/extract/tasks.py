"""Writing a region as a task folder: plain JAX emitted from the layer's program, one function per size.

The folder holds ``task.yaml`` and ``reference.py``. The region's ``get_inputs`` draws the layer's inputs with
the layer's own ``get_inputs`` (its code is carried in the file under a ``_layer_`` prefix) and runs the
layer up to the region, so a kernel is tested on the values it will really see inside the layer. The file
imports nothing but what the layer's reference does, so the region's reference is itself a sound candidate
(the baseline every region session judges first).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import yaml

from maxkernel.analysis.program import Program
from maxkernel.extract.names import namespaced
from maxkernel.rewrites.emit import emit_function

CATEGORY = {"attention": "attention", "matmul": "matmul", "experts": "moe", "norm": "normalization",
            "routing": "moe", "scan": "recurrence", "conv": "conv", "elementwise": "elementwise"}

_HEADER = '''"""{doc}

Written by ``maxkernel extract`` from {layer}: plain JAX, one function per size (the programs differ only
in their shapes; the arguments' shapes pick one). ``get_inputs`` draws the layer's inputs and runs the layer
up to this region.
"""

{imports}

'''

_FOOTER = '''

_SIZES = {sizes!r}
_SHAPES = {shapes!r}


def _size_named(values):
    """The name of the layer size ``values`` (cpu, full or a rung between them that checks run at)."""
    for name, known in _SIZES:
        if dict(known) == values:
            return name
    raise ValueError(f"no region program for layer size {{values}}")


def _size_of(*args):
    """The size whose program this region runs: the one its arguments are shaped for."""
    shapes = tuple(tuple(a.shape) for a in args)
    for name, known in _SHAPES:
        if known == shapes:
            return name
    raise ValueError(f"no region program for argument shapes {{shapes}}")


def get_inputs(key, **size):
    args, _ = _layer_get_inputs(key, **size)
    return tuple(jax.jit({{{prefix}}}[_size_named(size)])(*args)), {{}}


def reference({params}):
    return {{{region}}}[_size_of({params})]({params})
'''


def region_source(doc: str, layer_id: str, sizes: dict[str, dict[str, Any]], regions: dict[str, Program],
                  prefixes: dict[str, Program], layer_source: str) -> str:
    """The region's ``reference.py``; ``layer_source`` is the layer's reference, whose names it carries
    under the ``_layer_`` prefix."""
    found, layer_code = namespaced(layer_source, "_layer_")
    imports = ["import jax", "import jax.numpy as jnp", *found]
    parts = [_HEADER.format(doc=doc, layer=layer_id, imports="\n".join(dict.fromkeys(imports)))]
    parts.append("\n# the layer's reference (its get_inputs draws the layer's inputs)\n")
    parts.append("\n\n\n".join(layer_code) + "\n\n\n")
    for size in sizes:
        parts.append(emit_function(prefixes[size], f"_inputs_{size}", f"the layer's inputs -> this region's ({size})"))
        parts.append("\n\n")
        parts.append(emit_function(regions[size], f"_region_{size}", f"the region itself ({size})"))
        parts.append("\n\n")
    prefix = ", ".join(f"{s!r}: _inputs_{s}" for s in sizes)
    region = ", ".join(f"{s!r}: _region_{s}" for s in sizes)
    params = ", ".join(parameter_names(regions[next(iter(sizes))]))
    shapes = tuple((size, tuple(tuple(v.shape) for v in regions[size].inputs)) for size in sizes)
    known = tuple((size, tuple(values.items())) for size, values in sizes.items())
    return "".join(parts).rstrip() + "\n" + _FOOTER.format(shapes=shapes, sizes=known, prefix=prefix, region=region,
                                                           params=params)


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
