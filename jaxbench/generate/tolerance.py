"""A task's tolerance from the error its own reference makes under the target's numerics.

The reference is run twice on the same inputs: as a TPU computes it (``jaxbench.tpu_numerics``: float32
matmuls at their precision class, everything else as compiled) and exactly (the same source re-read with
every floating dtype turned into float64, on the inputs widened to float64). The worst error, relative to
``1 + |exact|``, times a stated margin, is the tolerance: a kernel as accurate as the reference passes with
room to spare, and one that drops precision the reference keeps does not.
"""

from __future__ import annotations

import ast
import math
import types
from functools import partial
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jaxbench.compare import tree_leaves
from jaxbench.task import Task
from jaxbench.tpu_numerics import computed_as_on_tpu

MARGIN = 4.0  # the tolerance is this many times the reference's own worst error
FLOOR = {"float32": 1e-5, "bfloat16": 8e-3, "float16": 1e-3}  # never tighter than the output dtype resolves
FLOAT_NAMES = {"float32", "bfloat16", "float16", "float64"}


class _Widen(ast.NodeTransformer):
    """Every floating dtype named in the source becomes float64; explicit precisions become HIGHEST."""

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        self.generic_visit(node)
        if node.attr in FLOAT_NAMES:
            return ast.copy_location(ast.Attribute(value=node.value, attr="float64", ctx=node.ctx), node)
        if node.attr in ("DEFAULT", "HIGH") and isinstance(node.value, ast.Attribute) and node.value.attr == "Precision":
            return ast.copy_location(ast.Attribute(value=node.value, attr="HIGHEST", ctx=node.ctx), node)
        return node

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        if isinstance(node.value, str) and node.value in FLOAT_NAMES:
            return ast.copy_location(ast.Constant("float64"), node)
        return node


def widened_reference(task: Task) -> Any:
    """The task's ``reference`` from its source with every float dtype read as float64."""
    tree = _Widen().visit(ast.parse(task.reference_path.read_text()))
    ast.fix_missing_locations(tree)
    module = types.ModuleType(f"widened_{task.id}")
    module.__file__ = str(task.reference_path)
    exec(compile(tree, str(task.reference_path), "exec"), module.__dict__)
    return module.reference


def _widen_args(args: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(np.asarray(a, dtype=np.float64) if _is_float(a) else np.asarray(a) for a in args)


def _is_float(a: Any) -> bool:
    dtype = np.dtype(a.dtype)
    return dtype.kind == "f" or dtype.name == "bfloat16"


def reference_error(task: Task, size: str = "cpu", keys: tuple[int, ...] = (0, 1)) -> tuple[float, float]:
    """(worst ``|tpu - exact| / (scale + |exact|)``, ``scale``) over every output, on inputs of ``keys`` and their
    shifted form, where an output's ``scale`` is its root mean square (at least 1): a near-zero element of
    a large output is judged by the output's magnitude, not its own."""
    from jaxbench.evaluate import shifted

    exact_fn = widened_reference(task)
    worst, scale = 0.0, 1.0
    for k in keys:
        args, static = task.get_inputs(jax.random.key(k), size)
        host = [np.asarray(a) for a in args]
        for inputs in (host, shifted(host)) if k == keys[0] else (host,):
            fn = partial(task.reference, **static)
            tpu_fn, _ = computed_as_on_tpu(fn, jax.make_jaxpr(fn)(*inputs), inputs)
            got = tree_leaves(jax.jit(tpu_fn)(*inputs))
            with jax.enable_x64(True):
                exact = tree_leaves(jax.jit(partial(exact_fn, **static))(*_widen_args(tuple(inputs))))
            for g, e in zip(got, exact):
                g64 = np.asarray(g).astype(np.float64)
                e64 = np.asarray(e).astype(np.float64)
                if g64.shape != e64.shape:
                    raise ValueError(f"{task.id}: exact output shape {e64.shape} != {g64.shape}")
                if not g64.size:
                    continue
                rms = max(1.0, float(np.sqrt(np.mean(np.square(e64)))))
                err = float(np.max(np.abs(g64 - e64) / (rms + np.abs(e64))))
                if err > worst:
                    worst, scale = err, rms
    return worst, scale


def tolerance_from_error(error: float, dtype: str, margin: float = MARGIN) -> float:
    """``margin`` times ``error``, no tighter than the dtype floor, rounded up to two significant digits."""
    value = max(error * margin, FLOOR.get(dtype, 1e-5))
    exponent = math.floor(math.log10(value))
    step = 10.0 ** (exponent - 1)
    return float(f"{math.ceil(value / step) * step:.2g}")


def tolerance_for(task_dir: Path, dtype: str, margin: float = MARGIN) -> tuple[float, float, float]:
    """(atol, rtol, the reference's own relative error) for the task folder ``task_dir``: rtol is ``margin``
    times the error, atol the same times the output's scale."""
    from jaxbench.task import load_task

    error, scale = reference_error(load_task(task_dir))
    rtol = tolerance_from_error(error, dtype, margin)
    return tolerance_from_error(error * scale, dtype, margin), rtol, error
