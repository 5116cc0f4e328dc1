"""Splicing: one layer candidate from its regions, each either a verified region kernel or the region's own
reference, so the whole layer can be judged by the evaluator like any other candidate.

Every region's code keeps its own names under a prefix (``r03_kernel``), imports are hoisted and shared.
A region left as its reference runs the code emitted at ``full``, which reads its shapes from its
arguments, at every size: the code a TPU check runs below ``full`` is the code priced there. Only a size
whose own program is written otherwise (``own_sizes``) runs a function of its own, picked by the shapes of
the layer's arguments.
"""

from __future__ import annotations

import re
from pathlib import Path

from maxkernel.extract.layer import Extraction
from maxkernel.extract.names import namespaced
from maxkernel.extract.tasks import keyword_names, shared_statics

_OWN = re.compile(r"^def _region_(\w+)\(", re.MULTILINE)


def own_sizes(source: str) -> list[str]:
    """The sizes a region's reference holds a function of its own for (see ``tasks.shared_function``)."""
    return _OWN.findall(source)


def splice(extraction: Extraction, kernels: dict[int, str], arg_shapes: dict[str, list[tuple[int, ...]]]) -> str:
    """The layer candidate: region ``i`` runs ``kernels[i]`` (a region candidate's source) or its reference.

    ``arg_shapes`` maps each size (cpu, full) to the layer's argument shapes at that size.
    """
    imports: list[str] = ["import jax", "import jax.numpy as jnp"]
    blocks: list[str] = []
    calls: list[str] = []
    for info in extraction.regions:
        prefix = f"r{info.index:02d}_"
        if info.index in kernels:
            found, code = namespaced(kernels[info.index], prefix)
            bound = "".join(f", {name}=static[{name!r}]" for name in keyword_names(kernels[info.index], "kernel"))
            call = f"{prefix}kernel({', '.join(info.inputs)}{bound})"
            what = "verified region kernel"
        else:
            source = Path(info.path, "reference.py").read_text()
            own = own_sizes(source)
            _, code = namespaced(source, prefix, keep={"_region", *(f"_region_{s}" for s in own)})
            found = []  # emitted region code needs only jax and jnp
            table = "".join(f"{prefix}_region_{s} if size == {s!r} else " for s in own)
            bound = "".join(f", {name}=static[{name!r}]" for name in shared_statics(source))
            shared = f"{prefix}_region({', '.join(info.inputs)}{bound})"
            call = shared
            if own:
                call = f"(({table}None)({', '.join(info.inputs)}) if size in {tuple(own)!r} else {shared})"
            what = "the region's reference"
        imports.extend(i for i in found if i not in imports)
        blocks.append(f"# region {info.index} ({info.kind}): {what}\n" + "\n\n".join(code))
        targets = ", ".join(info.outputs) + ("," if len(info.outputs) == 1 else "")
        call = call if len(info.outputs) > 1 else f"_as_tuple({call})"
        calls.append(f"    {targets} = {call}")
    params = ", ".join(extraction.inputs)
    outs = ", ".join(extraction.outputs)
    returns = extraction.outputs[0] if len(extraction.outputs) == 1 else f"({outs},)"
    head = [f'"""{extraction.layer}: the layer re-joined from its regions (written by maxkernel optimize-model)."""',
            "", *sorted(set(imports), key=imports.index), "", f"_SIZES = {tuple((k, tuple(tuple(x) for x in v)) for k, v in arg_shapes.items())!r}", "", "",
            "def _as_tuple(value):", "    return value if isinstance(value, tuple) else (value,)", "", ""]
    kernel = [f"def kernel({params}, **static):",
              f"    shapes = [tuple(a.shape) for a in ({params},)]",
              "    size = next((s for s, known in _SIZES if list(known) == shapes), None)",
              *calls, f"    return {returns}"]
    return "\n".join(head) + "\n\n\n".join(blocks) + "\n\n\n" + "\n".join(kernel) + "\n"
