"""The peer's plain-JAX starting programs (``../shared/calibration/autocomp_v6e/*_trace.py``) as task folders.

A trace file is one nested ``CodeCandidate(...)`` expression; it is parsed (``ast``), never executed. Its
innermost node (``parent=None``) holds the starting program: ``CONFIG`` (the published shapes),
``create_inputs()`` and ``workload(...)``. Where that program is plain JAX (no ``pallas``), the folder built
for it holds the program's own text with two changes: ``create_inputs`` takes the configuration and the key
as arguments (its fixed ``jax.random.PRNGKey(...)`` becomes the key the evaluator passes), and ``CONFIG``
is a tuple of its items (the evaluator refuses a candidate with module-level mutable state, and the
reference is judged as a candidate too); and a short adapter: ``get_inputs`` calls ``create_inputs`` with
``CONFIG`` updated by the size, ``reference`` calls ``workload``. ``full`` is the published CONFIG; ``cpu`` shrinks the
sequence and head counts into ``task_check``'s time window. Folders are written at run time, outside the
repository; the tolerance comes from the program's own error (``jaxbench.generate.tolerance``).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import yaml

CPU_SEQ = 512
CPU_HEADS = 4


def starting_program(trace: Path) -> str:
    """The ``code`` of the innermost ``CodeCandidate`` of ``trace`` (parsed, not run)."""
    tree = ast.parse(trace.read_text())
    node = tree.body[0].value if tree.body and isinstance(tree.body[0], ast.Expr) else None
    while isinstance(node, ast.Call):
        fields = {k.arg: k.value for k in node.keywords}
        parent = fields.get("parent")
        if parent is None or (isinstance(parent, ast.Constant) and parent.value is None):
            code = fields.get("code")
            if isinstance(code, ast.Constant) and isinstance(code.value, str):
                return code.value
            break
        node = parent
    raise ValueError(f"{trace}: no innermost CodeCandidate with a code string")


class _ToContract(ast.NodeTransformer):
    """``create_inputs`` takes the configuration and the key as arguments: ``CONFIG`` read inside it becomes
    its ``config`` argument and a fixed ``jax.random.PRNGKey(n)`` / ``jax.random.key(n)`` its ``key`` one; the
    module's ``CONFIG`` literal becomes a tuple of its items (the evaluator refuses module-level mutable state)."""

    def __init__(self) -> None:
        self.inside = False

    def visit_Module(self, node: ast.Module) -> ast.AST:
        self.generic_visit(node)
        return node

    def visit_Assign(self, node: ast.Assign) -> ast.AST:
        self.generic_visit(node)
        if not self.inside and any(isinstance(t, ast.Name) and t.id == "CONFIG" for t in node.targets):
            node.value = ast.parse(f"tuple({ast.unparse(node.value)}.items())", mode="eval").body
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        if node.name != "create_inputs":
            return node
        self.inside = True
        self.generic_visit(node)
        self.inside = False
        node.args.args = [ast.arg("config"), ast.arg("key")] + node.args.args
        return node

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if self.inside and node.id == "CONFIG":
            return ast.copy_location(ast.Name("config", node.ctx), node)
        return node

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        f = node.func
        if (self.inside and isinstance(f, ast.Attribute) and f.attr in ("PRNGKey", "key")
                and ast.unparse(f.value) == "jax.random"):
            return ast.copy_location(ast.Name("key", ast.Load()), node)
        return node


def _config(program: str) -> dict[str, Any]:
    for stmt in ast.parse(program).body:
        if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "CONFIG" for t in stmt.targets):
            return ast.literal_eval(stmt.value)
    raise ValueError("the starting program has no literal CONFIG")


def _workload_params(program: str) -> list[str]:
    for stmt in ast.parse(program).body:
        if isinstance(stmt, ast.FunctionDef) and stmt.name == "workload":
            return [a.arg for a in stmt.args.args]
    raise ValueError("the starting program defines no workload()")


def _cpu_size(full: dict[str, int]) -> dict[str, int]:
    cpu = dict(full)
    for name, value in full.items():
        if "seq" in name or "len" in name:
            cpu[name] = min(value, CPU_SEQ)
        elif "heads" in name:
            cpu[name] = min(value, CPU_HEADS)
        elif name == "batch":
            cpu[name] = 1
    return cpu


def reference_source(program: str) -> str:
    """The program made to take the evaluator's key and sizes, plus the adapter to the task contract."""
    tree = _ToContract().visit(ast.parse(program))
    ast.fix_missing_locations(tree)
    params = ", ".join(_workload_params(program))
    adapter = f'''

# Adapter to the task contract (added by benchmarks/peer_tasks.py; the program above is the peer's).
def get_inputs(key, **size):
    return tuple(create_inputs({{**dict(CONFIG), **size}}, key)), {{}}


def reference({params}):
    return workload({params})
'''
    return ast.unparse(tree) + "\n" + adapter


def peer_task_folders(folder: Path, out: Path) -> list[Path]:
    """A task folder under ``out`` for each plain-JAX starting program of ``folder``'s traces."""
    import jax

    from jaxbench.generate.tolerance import tolerance_for

    written = []
    for trace in sorted(folder.glob("*_trace.py")):
        program = starting_program(trace)
        if "pallas" in program:
            continue  # the starting point is already a kernel: not a plain-JAX program
        name = trace.name.removesuffix("_trace.py")
        task_dir = out / f"peer_{name}"
        if (task_dir / "task.yaml").is_file():
            written.append(task_dir)
            continue
        config = _config(program)
        full = {k: v for k, v in config.items() if isinstance(v, int) and not isinstance(v, bool)}
        task_dir.mkdir(parents=True, exist_ok=True)
        (task_dir / "reference.py").write_text(reference_source(program))
        spec: dict[str, Any] = {
            "id": f"peer_{name}", "name": f"peer_{name}", "category": "recurrence",
            "description": f"the plain-JAX starting program of the published {name} trace ({config.get('model', '')}, "
                           f"{config.get('operator', '')}), at its published shapes",
            "dtype": "float32", "tolerance": {"atol": 1.0, "rtol": 1.0}, "sizes": {"cpu": _cpu_size(full), "full": full}}
        (task_dir / "task.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
        from jaxbench.task import load_task
        from jaxbench.task_check import full_shapes

        _, _, outs = full_shapes(load_task(task_dir), "cpu")
        spec["dtype"] = str(jax.tree_util.tree_leaves(outs)[0].dtype)
        (task_dir / "task.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
        atol, rtol, _ = tolerance_for(task_dir, spec["dtype"])
        spec["tolerance"] = {"atol": atol, "rtol": rtol}
        (task_dir / "task.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
        written.append(task_dir)
    return written
