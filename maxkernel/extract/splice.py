"""Splicing: one layer candidate from its regions, each either a verified region kernel or the region's own
reference, so the whole layer can be judged by the evaluator like any other candidate.

Every region's code keeps its own names under a prefix (``r03_kernel``), imports are hoisted and shared.
The candidate picks the per-size reference functions by the shapes of its arguments.
"""

from __future__ import annotations

import ast
from pathlib import Path

from maxkernel.extract.layer import Extraction


class _Prefix(ast.NodeTransformer):
    """Rename the module-level names of one region's code."""

    def __init__(self, names: set[str], prefix: str) -> None:
        self.names, self.prefix = names, prefix

    def _new(self, name: str) -> str:
        return f"{self.prefix}{name}" if name in self.names else name

    def visit_Name(self, node: ast.Name) -> ast.Name:
        node.id = self._new(node.id)
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.FunctionDef:
        node.name = self._new(node.name) if node in self.top else node.name
        self.generic_visit(node)
        return node

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.ClassDef:
        node.name = self._new(node.name) if node in self.top else node.name
        self.generic_visit(node)
        return node

    def visit_Global(self, node: ast.Global) -> ast.Global:
        node.names = [self._new(n) for n in node.names]
        return node

    top: list[ast.stmt] = []


def _bound_names(body: list[ast.stmt]) -> set[str]:
    names: set[str] = set()
    for stmt in body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(stmt.name)
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return names


def namespaced(source: str, prefix: str, keep: set[str] | None = None) -> tuple[list[str], list[str]]:
    """(import lines, the other top-level code with its names prefixed); ``keep`` limits which defs stay."""
    tree = ast.parse(source)
    imports = [ast.unparse(s) for s in tree.body if isinstance(s, (ast.Import, ast.ImportFrom))]
    body = [s for s in tree.body if not isinstance(s, (ast.Import, ast.ImportFrom))
            and not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    if keep is not None:
        body = [s for s in body if isinstance(s, ast.FunctionDef) and s.name in keep]
    renamer = _Prefix(_bound_names(body), prefix)
    renamer.top = body
    return imports, [ast.unparse(renamer.visit(s)) for s in body]


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
            call = f"{prefix}kernel({', '.join(info.inputs)}, size=size)"
            what = "verified region kernel"
        else:
            sizes = list(arg_shapes)
            _, code = namespaced(Path(info.path, "reference.py").read_text(), prefix,
                                 keep={f"_region_{s}" for s in sizes})
            found = []  # emitted region code needs only jax and jnp
            table = "".join(f"{prefix}_region_{s} if size == {s!r} else " for s in sizes[:-1])
            table += f"{prefix}_region_{sizes[-1]}"
            call = f"({table})({', '.join(info.inputs)})"
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
              "    if size is None:",
              "        raise ValueError(f'no region programs for argument shapes {shapes}')",
              *calls, f"    return {returns}"]
    return "\n".join(head) + "\n\n\n".join(blocks) + "\n\n\n" + "\n".join(kernel) + "\n"
