"""Writing a region as a task folder: plain JAX emitted from the layer's program, one function per size.

The folder holds ``task.yaml``, ``reference.py`` and ``layer.py`` (a copy of the layer's reference, whose
``get_inputs`` draws the weights). The region's ``get_inputs`` runs the layer up to the region, so a kernel
is tested on the values it will really see inside the layer.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import yaml

from maxkernel.analysis.program import Program
from maxkernel.rewrites.emit import emit_function

CATEGORY = {"attention": "attention", "matmul": "matmul", "experts": "moe", "norm": "normalization",
            "routing": "moe", "scan": "recurrence", "conv": "conv", "elementwise": "elementwise"}

_HEADER = '''"""{doc}

Written by ``maxkernel extract`` from {layer}: plain JAX, one function per size (the programs differ only
in their shapes). ``get_inputs`` draws the layer's inputs and runs the layer up to this region.
"""

import functools
import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp

LAYER_SIZES = {sizes!r}


@functools.cache
def _layer():
    spec = importlib.util.spec_from_file_location("{module}", Path(__file__).with_name("layer.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

'''

_FOOTER = '''

_PREFIX = {{{prefix}}}
_REGION = {{{region}}}


def get_inputs(key, *, size):
    args, _ = _layer().get_inputs(key, **LAYER_SIZES[size])
    return tuple(jax.jit(_PREFIX[size])(*args)), {{"size": size}}


def reference(*args, size):
    return _REGION[size](*args)
'''


def region_source(doc: str, layer_id: str, sizes: dict[str, dict[str, Any]], regions: dict[str, Program],
                  prefixes: dict[str, Program]) -> str:
    """The region's ``reference.py``."""
    module = f"_layer_{layer_id}".replace("-", "_").replace(".", "_")
    parts = [_HEADER.format(doc=doc, layer=layer_id, sizes=sizes, module=module)]
    for size in sizes:
        parts.append(emit_function(prefixes[size], f"_inputs_{size}", f"the layer's inputs -> this region's ({size})"))
        parts.append("\n\n")
        parts.append(emit_function(regions[size], f"_region_{size}", f"the region itself ({size})"))
        parts.append("\n\n")
    prefix = ", ".join(f"{s!r}: _inputs_{s}" for s in sizes)
    region = ", ".join(f"{s!r}: _region_{s}" for s in sizes)
    return "".join(parts).rstrip() + "\n" + _FOOTER.format(prefix=prefix, region=region)


def write_region_task(folder: Path, *, task_id: str, name: str, kind: str, description: str, dtype: str,
                      tolerance: dict[str, float], layer_reference: Path, source: str) -> Path:
    """Write one region folder; an existing folder of the same name is replaced."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    spec = {"id": task_id, "name": name, "category": CATEGORY.get(kind, "elementwise"), "description": description,
            "dtype": dtype, "tolerance": tolerance, "sizes": {"cpu": {"size": "cpu"}, "full": {"size": "full"}}}
    (folder / "task.yaml").write_text(yaml.safe_dump(spec, sort_keys=False, width=110))
    (folder / "reference.py").write_text(source)
    shutil.copyfile(layer_reference, folder / "layer.py")
    return folder


def float_first(program: Program) -> Program:
    """Put a floating output first: a task's dtype is its first output's."""
    floats = [o for o in program.outputs if jnp.issubdtype(o.dtype, jnp.floating)]
    others = [o for o in program.outputs if o not in floats]
    program.outputs = floats + others
    return program
