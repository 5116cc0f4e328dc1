"""A task seen in another layout of the same work: sketches read a computation, not how it stacks its axes.

Two views, each found on the traced program by data flow:
- **without the unit axis**: every argument and result carries a leading axis of one (a layer under
  ``jax.vmap`` over one example). Every matmul is a batched one there; the view drops the axis
  (:mod:`maxkernel.analysis.unit_axis`);
- **rows merged**: the results lead with two parallel axes that the arguments carrying them hold side by side
  (``[batch, seq, d]`` activations). The view merges them into one axis of rows
  (:mod:`maxkernel.analysis.merge_axes`);
- **reshaped at the edges**: arguments the computation reads only through a reshape, results it makes by a
  last reshape (a batch merged into the rows by the caller and split inside). The view takes and gives them
  in the layout the work uses (:mod:`maxkernel.analysis.boundary_reshapes`).

The planner offers each sketch that does not apply to a task as it is on its view: a task folder whose
reference traces the original at the view's argument shapes with the layout put back, rebuilds that program
in the view's layout and runs it. The sketch renders for the view; the candidate is that source with a
``kernel`` that reshapes the arguments into the view's layout and the results back (reshapes, which XLA
does in place), and the evaluator judges it against the original reference like any other.
"""

from __future__ import annotations

import functools
import re
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax

from maxkernel.analysis.boundary_reshapes import between_reshapes, boundary_reshapes, edge_programs
from maxkernel.analysis.merge_axes import leading_pair, merge_leading_axes
from maxkernel.analysis.program import (Program, ProgramBuilder, arg_names, input_shapes, probe_sizes, run_program,
                                        static_args, trace_program)
from maxkernel.analysis.unit_axis import drop_unit_axis, has_unit_axis
from maxkernel.rewrites.emit import EmitError
from maxkernel.rewrites.sized import emit_every_size, integer_statics, keywords
from maxkernel.sketches.axes import reshape_groups

if TYPE_CHECKING:
    from jaxbench.task import Task

# The values of a strategy's ``view`` parameter when it was planned on one of the task's views.
WITHOUT_UNIT_AXIS = "without_unit_axis"
ROWS_MERGED = "rows_merged"
RESHAPED = "reshaped_at_edges"
VIEWS = (WITHOUT_UNIT_AXIS, ROWS_MERGED, RESHAPED)
_ROOT = Path(tempfile.gettempdir()) / "maxkernel-views"

REFERENCE = '''"""{doc}"""

from jaxbench.task import load_task
from maxkernel.rules.views import view_inputs, view_reference

_ORIGINAL = load_task({path!r})
VIEW = {kind!r}
# rows merged: argument index -> the axis where its two merged axes start; reshaped at the edges: argument
# index -> its axes in groups, each group of the argument's axes with the group of the view's that it becomes
CARRIERS = {carriers!r}


def get_inputs(key, **size):
    return view_inputs(_ORIGINAL, VIEW, CARRIERS, key, size)


def reference({params}, **static):
    return view_reference(_ORIGINAL, VIEW, CARRIERS, ({args}), static)
'''


def _merged(shape: tuple[int, ...], at: int) -> tuple[int, ...]:
    return (*shape[:at], shape[at] * shape[at + 1], *shape[at + 2:])


def view_inputs(original: "Task", kind: str, carriers: dict[int, int], key: Any,
                size: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The original's inputs in the view's layout."""
    args, static = original.module.get_inputs(key, **size)
    if kind == WITHOUT_UNIT_AXIS:
        return tuple(a[0] for a in args), static
    if kind == RESHAPED:
        closed = jax.make_jaxpr(functools.partial(original.reference, **static))(*args)
        entries, _ = boundary_reshapes(ProgramBuilder().build(closed, [f"arg{i}" for i in range(len(args))]))
        return tuple(a.reshape(entries[i].out.shape) if i in entries else a for i, a in enumerate(args)), static
    return tuple(a.reshape(_merged(a.shape, carriers[i])) if i in carriers else a for i, a in enumerate(args)), static


def _rebuilt(original: "Task", kind: str, carriers: dict[int, int], shapes: list[Any],
             static: dict[str, Any]) -> Program:
    closed, out_shape = jax.make_jaxpr(functools.partial(original.reference, **static), return_shape=True)(*shapes)
    names = arg_names(original)
    program = ProgramBuilder().build(closed, (names + [f"arg{i}" for i in range(len(names), len(shapes))])[:len(shapes)])
    program.out_tree = jax.tree_util.tree_structure(out_shape)
    if kind == RESHAPED:
        rebuilt: Program | str = between_reshapes(program, *boundary_reshapes(program))
    else:
        rebuilt = drop_unit_axis(program) if kind == WITHOUT_UNIT_AXIS else merge_leading_axes(program, carriers)
    if isinstance(rebuilt, str):
        raise ValueError(f"{original.path}: not in the {kind} layout at these shapes: {rebuilt}")
    return rebuilt


def view_reference(original: "Task", kind: str, carriers: dict[int, int], args: tuple[Any, ...],
                   static: dict[str, Any]) -> Any:
    """The original computation on ``args`` in the view's layout: the original traced at those arguments
    with the layout put back (merged rows as one row of them each: the axes are parallel, so how the rows
    split does not change the program), rebuilt in the view's layout and run."""
    if kind == WITHOUT_UNIT_AXIS:
        shapes = [jax.ShapeDtypeStruct((1, *a.shape), a.dtype) for a in args]
    elif kind == RESHAPED:
        shapes = [jax.ShapeDtypeStruct(_unreshaped(a.shape, carriers[i]) if i in carriers else a.shape, a.dtype)
                  for i, a in enumerate(args)]
    else:
        shapes = [jax.ShapeDtypeStruct((*a.shape[:carriers[i]], 1, *a.shape[carriers[i]:]) if i in carriers else a.shape,
                                       a.dtype) for i, a in enumerate(args)]
    return run_program(_rebuilt(original, kind, carriers, shapes, static), list(args))


def _unreshaped(shape: tuple[int, ...], groups: list[list[list[int]]]) -> tuple[int, ...]:
    """An argument's own shape from its shape in the view: each group of its axes takes the extent of the
    view's group it became (axes merged in the view: the extent on the group's last axis, ones before it)."""
    found: list[int] = []
    for axes, view_axes in groups:
        extent = 1
        for j in view_axes:
            extent *= shape[j]
        found.extend([1] * (len(axes) - 1) + [extent] if axes else [])
    return tuple(found)


def _edges(task: "Task") -> tuple[str, str, list[str]] | str:
    """The reshapes at the task's edges written as two functions (into the view, out of it) that read every
    extent from their inputs or the task's integer statics (a batch count: keyword-only arguments, their
    names returned) at every size; or why they cannot be."""
    sized = [(task, "cpu"), (task, "full"), *probe_sizes(task, "cpu")]
    # Every size parameter moved by its own amount besides: the check size shrinks fixed extents too, so an
    # extent that equals another at the task's sizes (in and out features both 1024) must not be read from
    # the wrong one. A task whose sizes cannot all move (heads that must divide) goes without: the judge
    # checks at the check size.
    values = task.size("cpu")
    moved = {k: v + 8 * (i + 1) if isinstance(v, int) and not isinstance(v, bool) and v >= 1 else v
             for i, (k, v) in enumerate(values.items())}
    sized.append((task.with_size("edges_probe", moved), "edges_probe"))
    programs, integers = [], []
    for t, size in sized:
        try:
            programs.append(trace_program(t, size))
        except Exception:  # noqa: BLE001 - only the moved sizes may fail here: the task's own traced before
            continue
        # A batch count of one at one size is a static like any other here: the moved size makes it nine.
        integers.append(integer_statics(static_args(t, size), minimum=1))
    into, back = zip(*(edge_programs(p, *boundary_reshapes(p)) for p in programs))
    try:
        written = [emit_every_size(list(into), "_into_view", statics=True, integers=integers),
                   emit_every_size(list(back), "_out_of_view", statics=True, integers=integers)]
    except EmitError as exc:
        return f"the reshapes at the edges cannot be written for every size: {exc}"
    if written[0] is None or written[1] is None:
        return "the reshapes at the edges do not read their extents from the arguments and integer statics"
    names = sorted({n for w in written for n in keywords(w)})
    return written[0], written[1], names


def view_reason(task: "Task", kind: str) -> str | dict[int, Any]:
    """The carriers of the view (empty for the unit axis) when ``task`` is in its layout at every size and
    its program can be rebuilt there; else why not."""
    found: dict[int, int] | None = None
    for size in ("cpu", "full"):
        program = trace_program(task, size)
        if kind == WITHOUT_UNIT_AXIS:
            if not has_unit_axis([s.shape for s in input_shapes(task, size)]):
                return "not every argument leads with an axis of one"
            carriers: dict[int, Any] | str = {}
            rebuilt = drop_unit_axis(program)
        elif kind == RESHAPED:
            entries, exits = boundary_reshapes(program)
            if not entries:
                return "no argument is read only through a reshape"
            carriers = {i: [[list(a), list(b)] for a, b in reshape_groups(tuple(program.inputs[i].shape), tuple(n.out.shape))]
                        for i, n in entries.items()}
            rebuilt = between_reshapes(program, entries, exits)
        else:
            carriers = leading_pair(program)
            if isinstance(carriers, str):
                return carriers
            rebuilt = merge_leading_axes(program, carriers)
        if isinstance(rebuilt, str):
            return rebuilt
        if found is not None and carriers != found:
            return "the arguments that carry the leading axes change with size"
        found = carriers
    assert found is not None
    if kind == RESHAPED:
        edges = _edges(task)
        if isinstance(edges, str):
            return edges
    return found


def unit_axis_reason(task: "Task") -> str | None:
    """None when the task can be seen without the axis of one; else why not."""
    found = view_reason(task, WITHOUT_UNIT_AXIS)
    return found if isinstance(found, str) else None


@functools.lru_cache(maxsize=64)
def _view_at(path: str, digest: str, kind: str) -> "Task | None":
    from jaxbench.task import load_task

    task = load_task(path)
    carriers = view_reason(task, kind)
    if isinstance(carriers, str):
        return None
    folder = _ROOT / f"{task.id}-{digest}-{kind}" / Path(path).name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "task.yaml").write_bytes((task.path / "task.yaml").read_bytes())
    names = arg_names(task)
    what = {WITHOUT_UNIT_AXIS: "without the leading axis of one on every argument and result",
            ROWS_MERGED: "with the two leading axes of its rows merged into one",
            RESHAPED: "taking its arguments and giving its results as its work reshapes them"}[kind]
    text = REFERENCE.format(doc=f"{task.id} {what} (a view of {task.path})", path=str(task.path), kind=kind,
                            carriers=carriers, params=", ".join(names), args="".join(f"{n}, " for n in names))
    target = folder / "reference.py"
    if not target.is_file() or target.read_text() != text:
        target.write_text(text)
    return load_task(folder)


def task_view(task: "Task", kind: str) -> "Task | None":
    """The view of ``task`` (a task folder of its own, written once per source), or None when the task is not
    in that view's layout."""
    if task.static_overrides:
        return None
    shapes = [s.shape for s in input_shapes(task, "cpu")]
    if kind == WITHOUT_UNIT_AXIS and not has_unit_axis(shapes):
        return None
    if kind == ROWS_MERGED and max((len(s) for s in shapes), default=0) < 3:
        return None
    if kind == RESHAPED and not any(n.prim == "reshape" for n in trace_program(task, "cpu").nodes):
        return None
    return _view_at(str(task.path.resolve()), task.source_digest, kind)


def unit_axis_view(task: "Task") -> "Task | None":
    return task_view(task, WITHOUT_UNIT_AXIS)


def wrap_candidate(source: str, task: "Task", kind: str) -> str:
    """A candidate for the view made a candidate for the task: ``kernel`` reshapes each argument into the
    view's layout, calls the view's kernel and reshapes each result back (reshapes: indexing an axis of one
    away is priced by XLA:TPU as a copy, a reshape as nothing)."""
    names = arg_names(task)
    head = "" if re.search(r"^import jax$", source, re.M) else "import jax\n"
    if kind == RESHAPED:
        edges = _edges(task)
        assert not isinstance(edges, str), edges
        args = ", ".join(names)

        def passed(text: str) -> str:  # the statics a function takes by name, from kernel's own
            return "".join(f", {n}=static[{n!r}]" for n in edges[2] if re.search(rf"\b{n}\b", text.partition("\n")[0]))

        return (f"{head}{source.rstrip()}\n\n\n_kernel_in_view = kernel\n\n\n{edges[0]}\n\n\n{edges[1]}\n\n\n"
                f"def kernel({args}, **static):\n"
                f'    """The arguments reshaped as the reference first reshapes them, the results as it last does."""\n'
                f"    out = _kernel_in_view(*_into_view({args}{passed(edges[0])}), **static)\n"
                f"    return _out_of_view(out, {args}{passed(edges[1])})\n")
    if kind == WITHOUT_UNIT_AXIS:
        inner = ", ".join(f"{n}.reshape({n}.shape[1:])" for n in names)
        doc = "Every argument and result carries a leading axis of one: the kernel above runs without it."
        back = "o.reshape((1, *o.shape))"
    else:
        carriers = view_reason(task, kind)
        assert not isinstance(carriers, str), carriers
        inner = ", ".join((f"{n}.reshape(-1, *{n}.shape[2:])" if carriers[i] == 0 else
                           f"{n}.reshape(*{n}.shape[:{carriers[i]}], -1, *{n}.shape[{carriers[i] + 2}:])")
                          if i in carriers else n for i, n in enumerate(names))
        first, at = next(iter(carriers.items()))
        doc = "The rows are kept in two leading axes: the kernel above runs over them merged into one."
        back = f"o.reshape({names[first]}.shape[{at}], {names[first]}.shape[{at + 1}], *o.shape[1:])"
    return (f"{head}{source.rstrip()}\n\n\n_kernel_in_view = kernel\n\n\n"
            f"def kernel({', '.join(names)}, **static):\n"
            f'    """{doc}"""\n'
            f"    out = _kernel_in_view({inner}, **static)\n"
            f"    return jax.tree_util.tree_map(lambda o: {back}, out)\n")
