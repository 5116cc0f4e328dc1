"""``maxkernel.extract(fn, *example_args)``: regions of a function in a user's code, without a task folder.

The function is traced at the example arguments and written as a layer task of its own (its program as plain
JAX, with ``get_inputs`` drawing fresh arrays shaped and ranged like the examples); that layer is then
extracted like any shipped one.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import yaml

from maxkernel.analysis.program import ProgramBuilder
from maxkernel.extract.layer import Extraction, extract_task
from maxkernel.rewrites.emit import emit_function


def _draw_line(i: int, arg: Any) -> str:
    shape, dtype = tuple(arg.shape), np.dtype(arg.dtype)
    if jnp.issubdtype(dtype, jnp.floating):
        return f"jax.random.normal(keys[{i}], {shape!r}, jnp.{dtype.name})"
    if jnp.issubdtype(dtype, jnp.integer):
        low, high = int(np.min(arg)), int(np.max(arg)) + 1
        return f"jax.random.randint(keys[{i}], {shape!r}, {low}, {high}, jnp.{dtype.name})"
    raise ValueError(f"argument {i}: dtype {dtype} is neither floating nor integer")


def write_layer_task(fn: Callable[..., Any], args: tuple[Any, ...], folder: Path, name: str,
                     atol: float = 2e-3, rtol: float = 2e-3) -> Path:
    """A task folder computing ``fn`` at the example arguments' shapes."""
    closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*args)
    program = ProgramBuilder().build(closed, [f"a{i}" for i in range(len(args))])
    program.out_tree = jax.tree_util.tree_structure(out_shape)
    draws = ", ".join(_draw_line(i, a) for i, a in enumerate(args)) + ("," if len(args) == 1 else "")
    source = (f'"""{name}: a user function traced at its example arguments (written by maxkernel.extract)."""\n\n'
              "import jax\nimport jax.numpy as jnp\n\n\n"
              f"def get_inputs(key):\n    keys = jax.random.split(key, {max(2, len(args))})\n"
              f"    return ({draws}), {{}}\n\n\n" + emit_function(program, "reference") + "\n")
    first = jax.tree_util.tree_leaves(out_shape)[0]
    spec = {"id": name, "name": name, "category": "model", "description": f"{name}, traced from a Python function.",
            "dtype": np.dtype(first.dtype).name, "tolerance": {"atol": atol, "rtol": rtol},
            "sizes": {"cpu": {}, "full": {}}}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "task.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    (folder / "reference.py").write_text(source)
    return folder


def extract_function(fn: Callable[..., Any], *example_args: Any, out: Path | None = None, name: str | None = None,
                     target: str = "cpu", timing: bool = True) -> Extraction:
    """Split ``fn`` into region tasks under ``out`` (a fresh temporary folder by default)."""
    out = Path(tempfile.mkdtemp(prefix="maxkernel-extract-")) if out is None else out
    name = name or getattr(fn, "__name__", "function").strip("<>") or "function"
    layer = write_layer_task(fn, tuple(example_args), out / f"{name}_layer", name)
    return extract_task(layer, out, target=target, timing=timing)
