"""A task seen without the leading axis of one that every argument and result carries.

Sketches match what a computation does; a batch of one kept as an axis (a layer under ``jax.vmap`` over
one example) changes how every op is written, not what it does. The planner offers each sketch that does
not apply to such a task as it is on its **view**: a task folder whose reference is the original traced at
the argument shapes with the axis put back, that axis dropped from the traced program
(:mod:`maxkernel.analysis.unit_axis`), and the result run. The sketch renders for the view; the candidate
is that source with a ``kernel`` that drops the axis from the arguments and puts it back on the results, and
the evaluator judges it against the original reference like any other.
"""

from __future__ import annotations

import functools
import re
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax

from maxkernel.analysis.program import ProgramBuilder, arg_names, input_shapes, run_program, trace_program
from maxkernel.analysis.unit_axis import drop_unit_axis, has_unit_axis

if TYPE_CHECKING:
    from jaxbench.task import Task

# The value of a strategy's ``view`` parameter when it was planned on the task's view.
WITHOUT_UNIT_AXIS = "without_unit_axis"
_ROOT = Path(tempfile.gettempdir()) / "maxkernel-views"

REFERENCE = '''"""{doc}"""

from jaxbench.task import load_task
from maxkernel.rules.views import view_inputs, view_reference

_ORIGINAL = load_task({path!r})


def get_inputs(key, **size):
    return view_inputs(_ORIGINAL, key, size)


def reference({params}, **static):
    return view_reference(_ORIGINAL, ({args}), static)
'''


def view_inputs(original: "Task", key: Any, size: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The original's inputs with the axis of one taken off each argument."""
    args, static = original.module.get_inputs(key, **size)
    return tuple(a[0] for a in args), static


def view_reference(original: "Task", args: tuple[Any, ...], static: dict[str, Any]) -> Any:
    """The original computation on ``args`` (without the axis of one), as its program without that axis."""
    shapes = [jax.ShapeDtypeStruct((1, *a.shape), a.dtype) for a in args]
    closed, out_shape = jax.make_jaxpr(functools.partial(original.reference, **static), return_shape=True)(*shapes)
    names = arg_names(original)
    program = ProgramBuilder().build(closed, (names + [f"arg{i}" for i in range(len(names), len(args))])[:len(args)])
    program.out_tree = jax.tree_util.tree_structure(out_shape)
    dropped = drop_unit_axis(program)
    if isinstance(dropped, str):
        raise ValueError(f"{original.path}: the axis of one cannot be dropped at these shapes: {dropped}")
    return run_program(dropped, list(args))


def unit_axis_reason(task: "Task") -> str | None:
    """None when every argument and result of ``task`` carries a leading axis of one at every size that
    the program can be seen without; else why not."""
    for size in ("cpu", "full"):
        if not has_unit_axis([s.shape for s in input_shapes(task, size)]):
            return "not every argument leads with an axis of one"
        dropped = drop_unit_axis(trace_program(task, size))
        if isinstance(dropped, str):
            return dropped
    return None


@functools.lru_cache(maxsize=64)
def _view_at(path: str, digest: str) -> "Task | None":
    from jaxbench.task import load_task

    task = load_task(path)
    if unit_axis_reason(task) is not None:
        return None
    folder = _ROOT / f"{task.id}-{digest}" / Path(path).name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "task.yaml").write_bytes((task.path / "task.yaml").read_bytes())
    names = arg_names(task)
    doc = f"{task.id} without the leading axis of one on every argument and result (a view of {task.path})"
    text = REFERENCE.format(doc=doc, path=str(task.path), params=", ".join(names), args="".join(f"{n}, " for n in names))
    target = folder / "reference.py"
    if not target.is_file() or target.read_text() != text:
        target.write_text(text)
    return load_task(folder)


def unit_axis_view(task: "Task") -> "Task | None":
    """The view of ``task`` (a task folder of its own, written once per source), or None when its arguments
    and results do not all carry an axis of one that the program can be seen without."""
    if task.static_overrides or not has_unit_axis([s.shape for s in input_shapes(task, "cpu")]):
        return None
    return _view_at(str(task.path.resolve()), task.source_digest)


def wrap_candidate(source: str, names: list[str]) -> str:
    """A candidate for the view made a candidate for the task: ``kernel`` takes the axis of one off each
    argument, calls the view's kernel and puts the axis back on each result (reshapes: indexing the axis
    away is priced by XLA:TPU as a copy, a reshape as nothing)."""
    head = "" if re.search(r"^import jax$", source, re.M) else "import jax\n"
    inner = ", ".join(f"{n}.reshape({n}.shape[1:])" for n in names)  # a reshape, which XLA does in place
    return (f"{head}{source.rstrip()}\n\n\n_kernel_without_unit_axis = kernel\n\n\n"
            f"def kernel({', '.join(names)}, **static):\n"
            f'    """Every argument and result carries a leading axis of one: the kernel above runs without it."""\n'
            f"    out = _kernel_without_unit_axis({inner}, **static)\n"
            f"    return jax.tree_util.tree_map(lambda o: o.reshape((1, *o.shape)), out)\n")
