"""Static scan of candidate source: refuse what an honest kernel never needs.

Every refusal names its rule, so reports say exactly which defence fired. The scan is a first line;
the sandbox and the runtime checks catch what slips past it.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

ALLOWED_IMPORT_ROOTS = {
    "jax", "numpy", "math", "functools", "itertools", "operator", "typing", "dataclasses", "enum",
    "__future__", "ml_dtypes", "einops",
}
SYSTEM_MODULES = {
    "os", "sys", "io", "pathlib", "socket", "subprocess", "shutil", "tempfile", "urllib", "http", "requests",
    "pickle", "shelve", "sqlite3", "multiprocessing", "threading", "concurrent", "ctypes", "cffi", "signal",
    "importlib", "builtins", "gc", "inspect", "time", "asyncio", "select", "mmap", "resource", "glob",
    "marshal", "code", "runpy", "pty", "fcntl", "atexit", "weakref", "traceback", "linecache", "zipimport",
    "webbrowser", "ftplib", "smtplib", "telnetlib", "ssl", "uuid", "random", "secrets", "datetime", "copyreg",
}
HARNESS_MODULES = {"jaxbench", "maxkernel", "reference", "conftest", "pytest"}
FORBIDDEN_CALLS = {
    "eval": "eval/exec", "exec": "eval/exec", "compile": "eval/exec", "__import__": "dynamic import",
    "open": "file access", "globals": "introspection", "locals": "introspection", "vars": "introspection",
    "setattr": "monkey-patching", "delattr": "monkey-patching", "getattr": "introspection",
    "breakpoint": "debugger", "input": "reading standard input", "memoryview": "raw memory access",
}
FORBIDDEN_ATTRS = {
    "__globals__", "__code__", "__builtins__", "__subclasses__", "__dict__", "__class__", "__bases__",
    "__mro__", "__closure__", "__getattribute__", "__setattr__", "__import__", "__loader__", "__spec__",
    "f_globals", "f_locals", "f_back", "gi_frame", "tb_frame", "__self__", "__func__", "__wrapped__",
    "cr_frame", "ag_frame", "f_builtins",
}
FILE_IO_ATTRS = {
    "load", "save", "savez", "savez_compressed", "fromfile", "tofile", "memmap", "loadtxt", "savetxt",
    "genfromtxt", "DataSource", "fromregex", "open_memmap",
}
CALLBACK_ATTRS = {"pure_callback", "io_callback", "callback", "host_callback", "debug_callback", "id_tap"}
CACHE_DECORATORS = {"lru_cache", "cache", "cached_property"}
MUTABLE_FACTORIES = {"dict", "list", "set", "defaultdict", "OrderedDict", "Counter", "deque", "bytearray"}


SYNTAX_RULE = "syntax"  # not a rule broken but code that does not parse: a compile error, not a rejection


@dataclass
class Finding:
    rule: str
    line: int
    detail: str

    def __str__(self) -> str:
        return f"{self.rule}: {self.detail} (line {self.line})"


def _root_name(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.value if not isinstance(node, ast.Call) else node.func
    return node.id if isinstance(node, ast.Name) else None


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


class _Scanner(ast.NodeVisitor):
    def __init__(self) -> None:
        self.findings: list[Finding] = []
        self.module_aliases: set[str] = set()
        self.pallas_aliases: set[str] = set()  # names bound to a Pallas module: its ``load`` is a masked ref read
        self.imports_pallas = False
        self.depth = 0
        self.constant_tables: set[int] = set()  # module-level assignments of tables never written after import

    def add(self, rule: str, node: ast.AST, detail: str) -> None:
        self.findings.append(Finding(rule, getattr(node, "lineno", 0), detail))

    def _check_module(self, name: str, node: ast.AST) -> None:
        root = name.split(".")[0]
        if root in HARNESS_MODULES or "reference" in name.split("."):
            self.add("imports-reference-or-harness", node, f"import of {name}")
        elif root in SYSTEM_MODULES:
            self.add("system-access", node, f"import of {name} (file, network, process or timer access)")
        elif root not in ALLOWED_IMPORT_ROOTS:
            self.add("disallowed-import", node, f"import of {name} (allowed: {', '.join(sorted(ALLOWED_IMPORT_ROOTS))})")
        if name.startswith("jax.experimental.pallas"):
            self.imports_pallas = True

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._check_module(alias.name, node)
            self.module_aliases.add(alias.asname or alias.name.split(".")[0])
            if alias.asname and alias.name.startswith("jax.experimental.pallas"):
                self.pallas_aliases.add(alias.asname)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            self.add("imports-reference-or-harness", node, "relative import")
            return
        module = node.module or ""
        self._check_module(module, node)
        for alias in node.names:
            if module == "jax.experimental" and alias.name == "pallas":
                self.imports_pallas = True
            if alias.name in CALLBACK_ATTRS:
                self.add("host-callback", node, f"import of {module}.{alias.name}")
            self.module_aliases.add(alias.asname or alias.name)
            if (module == "jax.experimental" and alias.name == "pallas") or module.startswith("jax.experimental.pallas"):
                self.pallas_aliases.add(alias.asname or alias.name)

    def visit_Call(self, node: ast.Call) -> None:
        if isinstance(node.func, ast.Name) and node.func.id in FORBIDDEN_CALLS:
            self.add(FORBIDDEN_CALLS[node.func.id].replace("/", "-").replace(" ", "-"), node, f"call to {node.func.id}()")
        dotted = _dotted(node.func)
        if dotted.endswith("config.update") or dotted.startswith("jax.config"):
            self.add("monkey-patching", node, f"{dotted}() changes JAX for every later candidate")
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in FORBIDDEN_ATTRS:
            self.add("introspection", node, f"access to .{node.attr}")
        pallas_read = node.attr == "load" and isinstance(node.value, ast.Name) and node.value.id in self.pallas_aliases
        if node.attr in FILE_IO_ATTRS and _root_name(node) in self.module_aliases and not pallas_read:
            self.add("file-access", node, f"use of {_dotted(node)} (reads or writes files)")
        if node.attr in CALLBACK_ATTRS:
            self.add("host-callback", node, f"use of {_dotted(node)} (Python running inside the timed kernel)")
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in ("__builtins__", "__import__", "__loader__", "__spec__"):
            self.add("introspection", node, f"use of {node.id}")

    def _check_target(self, target: ast.AST, node: ast.AST) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for elt in target.elts:
                self._check_target(elt, node)
            return
        if isinstance(target, (ast.Attribute, ast.Subscript)):
            root = _root_name(target)
            if root in self.module_aliases:
                self.add("monkey-patching", node, f"assignment to {_dotted(target) if isinstance(target, ast.Attribute) else root + '[...]'}")

    def visit_Assign(self, node: ast.Assign) -> None:
        for t in node.targets:
            self._check_target(t, node)
        if self.depth == 0:
            self._check_module_value(node.value, node)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._check_target(node.target, node)
        if self.depth == 0 and node.value is not None:
            self._check_module_value(node.value, node)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._check_target(node.target, node)
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        for t in node.targets:
            self._check_target(t, node)
        self.generic_visit(node)

    def _check_module_value(self, value: ast.AST, node: ast.AST) -> None:
        if id(node) in self.constant_tables:
            return
        mutable = isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp))
        if isinstance(value, ast.Call):
            name = value.func.attr if isinstance(value.func, ast.Attribute) else getattr(value.func, "id", "")
            mutable = name in MUTABLE_FACTORIES
        if mutable:
            self.add("module-level-cache", node, "module-level mutable container (could carry results between calls)")

    def visit_Global(self, node: ast.Global) -> None:
        self.add("module-level-cache", node, f"global statement ({', '.join(node.names)})")

    def visit_Nonlocal(self, node: ast.Nonlocal) -> None:
        self.add("module-level-cache", node, f"nonlocal statement ({', '.join(node.names)})")

    def _visit_scope(self, node: ast.AST) -> None:
        for deco in getattr(node, "decorator_list", []):
            name = deco.func if isinstance(deco, ast.Call) else deco
            last = name.attr if isinstance(name, ast.Attribute) else getattr(name, "id", "")
            if last in CACHE_DECORATORS:
                self.add("module-level-cache", deco, f"@{last} memoizes results between calls")
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = _visit_scope
    visit_AsyncFunctionDef = _visit_scope
    visit_Lambda = _visit_scope
    visit_ClassDef = _visit_scope

    def visit_Try(self, node: ast.Try) -> None:
        if node.handlers:
            self.add("try-fallback", node, "try/except can hide a fallback path; let errors surface")
        self.generic_visit(node)

    visit_TryStar = visit_Try


def scan(source: str) -> tuple[list[Finding], bool]:
    """Findings (empty when clean) and whether the candidate claims to be a Pallas kernel."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        # Said here, at the first stage, rather than found later by the worker's compile.
        return [Finding(SYNTAX_RULE, exc.lineno or 0, f"syntax error at line {exc.lineno}: {exc.msg}")], False
    scanner = _Scanner()
    scanner.constant_tables = constant_tables(tree)
    scanner.visit(tree)
    return scanner.findings, scanner.imports_pallas


# Uses of a constant table that only read it: its elements are immutable, so what these return cannot
# carry anything from one call to the next.
READ_METHODS = {"get", "keys", "values", "items", "index", "count", "copy"}
READ_CALLS = {"len", "sorted", "tuple", "list", "dict", "set", "frozenset", "enumerate", "zip", "max", "min", "sum",
              "any", "all", "iter", "reversed"}


def _immutable(node: ast.AST) -> bool:
    """A literal whose value can never change: constants, and tuples of them (a negative number included)."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return _immutable(node.operand)
    if isinstance(node, ast.Tuple):
        return all(_immutable(e) for e in node.elts)
    return False


def _table_literal(node: ast.AST) -> bool:
    if isinstance(node, ast.Dict):
        return all(k is not None and _immutable(k) and _immutable(v) for k, v in zip(node.keys, node.values))
    if isinstance(node, (ast.List, ast.Set)):
        return all(_immutable(e) for e in node.elts)
    return False


def _reads_only(name: ast.Name, parent: ast.AST | None, grandparent: ast.AST | None) -> bool:
    if isinstance(parent, ast.Subscript) and parent.value is name:
        return isinstance(parent.ctx, ast.Load)
    if isinstance(parent, ast.Attribute) and parent.value is name:
        return parent.attr in READ_METHODS and isinstance(grandparent, ast.Call) and grandparent.func is parent
    if isinstance(parent, ast.Call) and name in parent.args:
        return isinstance(parent.func, ast.Name) and parent.func.id in READ_CALLS
    if isinstance(parent, ast.Compare):
        return name in parent.comparators and all(isinstance(op, (ast.In, ast.NotIn)) for op in parent.ops)
    if isinstance(parent, (ast.For, ast.comprehension)):
        return parent.iter is name
    return False


def constant_tables(tree: ast.Module) -> set[int]:
    """Module-level assignments (their node ids) of a dict, list or set literal of immutable values to a name
    that is bound nowhere else and that every other use only reads (see ``_reads_only``): a table of block
    sizes or a configuration, not a cache."""
    candidates: dict[str, ast.AST] = {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else \
            node.target if isinstance(node, ast.AnnAssign) else None
        value = getattr(node, "value", None)
        if isinstance(target, ast.Name) and value is not None and _table_literal(value):
            candidates[target.id] = node
    if not candidates:
        return set()
    parents: dict[int, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[id(child)] = node
    spoiled: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            spoiled.update(node.names)
        if not isinstance(node, ast.Name) or node.id not in candidates:
            continue
        parent = parents.get(id(node))
        if isinstance(node.ctx, ast.Store) and parent is candidates[node.id]:
            continue  # the one binding
        if not isinstance(node.ctx, ast.Load) or not _reads_only(node, parent, parents.get(id(parent))):
            spoiled.add(node.id)
    return {id(node) for name, node in candidates.items() if name not in spoiled}
