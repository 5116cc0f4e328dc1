"""Module-level names of a piece of source kept apart under a prefix, so that several sources (region
kernels, a layer's reference) can share one module without clashing."""

from __future__ import annotations

import ast


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
