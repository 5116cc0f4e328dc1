"""Helpers shared by test modules (conftest.py holds only fixtures: its module name is not unique)."""

from __future__ import annotations

import importlib.util
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "jaxbench" / "examples"


def load_benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` as a module (benchmarks are scripts, not a package), registered under its
    name: pydantic resolves the postponed annotations of its models through ``sys.modules``."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def reference_candidate(task_id: str) -> str:
    """The task's own reference, as a candidate file (the honest baseline)."""
    from jaxbench.task import load_task

    return load_task(task_id).reference_path.read_text() + "\n\nkernel = reference\n"


def http_json(port: int, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """One request to a local JSON API: (status, decoded body), error statuses included."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def task_folder(parent: Path, name: str, task_yaml: str, source: str) -> Any:
    """A task folder ``parent/name`` with this ``task.yaml`` and ``reference.py``, loaded: a computation a
    test writes itself (in another style than the suite's, or a near miss)."""
    from jaxbench.task import load_task

    folder = parent / name
    folder.mkdir()
    (folder / "task.yaml").write_text(task_yaml)
    (folder / "reference.py").write_text(source)
    return load_task(folder)


def emitted(program: Any, name: str) -> Any:
    """The function ``emit_function`` writes for ``program``, executed: what a rewritten program computes."""
    from maxkernel.rewrites.emit import emit_function

    module = ModuleType(name)
    source = "import jax\nimport jax.numpy as jnp\n\n" + emit_function(program, name)
    exec(compile(source, f"{name}.py", "exec"), module.__dict__)
    return getattr(module, name)


def task_yaml(task_id: str, category: str, tolerance: float, cpu: dict[str, int], full: dict[str, int],
              free: str, dtype: str = "float32") -> str:
    """The ``task.yaml`` of a computation a test writes: its sizes, one free size parameter, one tolerance."""
    import yaml

    return yaml.safe_dump({"id": task_id, "name": task_id, "category": category, "dtype": dtype,
                           "description": f"a {category} computation written for a test.",
                           "tolerance": {"atol": tolerance, "rtol": tolerance},
                           "sizes": {"cpu": cpu, "full": full}, "free": {free: {}}}, sort_keys=False)
