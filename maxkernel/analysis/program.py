"""A small, editable program IR built from a jaxpr: the common ground of analysis, rewrites and emitters.

A jaxpr is immutable and nests calls (jit, custom_jvp); rewrites want a flat list of equations they can
replace. ``Program`` is that flat list: calls are inlined, literals and closed-over constants become
``Const`` operands, and every node keeps its primitive so the program can still be evaluated.
"""

from __future__ import annotations

import functools
import inspect
import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
import numpy as np
from jax._src import core, source_info_util

if TYPE_CHECKING:
    from jaxbench.task import Task

# Wrappers whose body is the computation: inlined so rewrites see through them.
INLINED = frozenset({"jit", "pjit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call",
                     "custom_vjp_call_jaxpr", "remat", "checkpoint", "named_call"})


@dataclass(frozen=True, eq=False)
class Var:
    """A value produced by a node or passed in as an argument."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    origin: tuple[str, int] | None = None  # the reference line that computed it, when known

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    @property
    def integer(self) -> bool:
        return bool(np.issubdtype(np.dtype(self.dtype), np.integer))


@dataclass(frozen=True, eq=False)
class Const:
    """A literal or captured constant (a scalar, or a small array)."""

    value: Any
    shape: tuple[int, ...]
    dtype: np.dtype
    weak: bool = False
    # The static argument this literal is, as (name, transform) of :mod:`maxkernel.analysis.statics`: an
    # emitter that takes statics as arguments writes it as that expression instead of the value.
    static: tuple[str, str] | None = None

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    def scalar(self) -> float | int | bool | None:
        """The Python value of a scalar constant (or of a uniform array), else None."""
        arr = np.asarray(self.value)
        if arr.size == 0:
            return None
        flat = arr.reshape(-1)
        if not np.all(flat == flat[0]):
            return None
        return flat[0].item()


Operand = Var | Const


@dataclass(eq=False)
class Node:
    """One equation: ``outs = primitive.bind(*ins, **params)``."""

    primitive: core.Primitive
    ins: list[Operand]
    outs: list[Var]
    params: dict[str, Any]
    source: tuple[str, int] | None = None  # (file, line) of the reference line that made it, when known
    notes: tuple[str, ...] = ()  # the rewrites that put it there or changed what it reads

    @property
    def prim(self) -> str:
        return self.primitive.name

    @property
    def out(self) -> Var:
        return self.outs[0]


@dataclass
class Program:
    """A flat program: named inputs, nodes in execution order, outputs."""

    inputs: list[Var]
    nodes: list[Node]
    outputs: list[Operand]
    out_tree: Any = None  # the reference's output pytree structure (None: a single array)
    _counter: itertools.count = field(default_factory=lambda: itertools.count(10_000), repr=False)
    dim_names: dict[int, str] = field(default_factory=dict)  # a size parameter's name, by its (unique) value
    notes: list[str] = field(default_factory=list)  # rewrites that acted on the outputs themselves

    def fresh(self, shape: tuple[int, ...], dtype: Any) -> Var:
        return Var(f"t{next(self._counter)}", tuple(int(d) for d in shape), np.dtype(dtype))

    def producers(self) -> dict[Var, Node]:
        return {out: node for node in self.nodes for out in node.outs}

    def users(self) -> dict[Var, list[Node]]:
        found: dict[Var, list[Node]] = {}
        for node in self.nodes:
            for op in node.ins:
                if isinstance(op, Var):
                    found.setdefault(op, []).append(node)
        return found

    def primitives(self) -> list[str]:
        return [n.prim for n in self.nodes]

    def ancestors(self, var: Var) -> list["Node"]:
        """The nodes ``var`` is computed from, in program order."""
        producers = self.producers()
        needed: set[int] = set()
        stack = [var]
        while stack:
            node = producers.get(stack.pop())
            if node is None or id(node) in needed:
                continue
            needed.add(id(node))
            stack.extend(op for op in node.ins if isinstance(op, Var))
        return [n for n in self.nodes if id(n) in needed]

    def reads(self, var: Var) -> set[str]:
        """Names of the program inputs ``var`` is computed from (empty for constants and iotas)."""
        inputs = {v: v.name for v in self.inputs}
        if var in inputs:
            return {inputs[var]}
        found: set[str] = set()
        for node in self.ancestors(var):
            found.update(inputs[op] for op in node.ins if isinstance(op, Var) and op in inputs)
        return found

    def copy(self) -> "Program":
        nodes = [Node(n.primitive, list(n.ins), list(n.outs), dict(n.params), n.source, n.notes) for n in self.nodes]
        return Program(list(self.inputs), nodes, list(self.outputs), self.out_tree, self._counter,
                       dict(self.dim_names), list(self.notes))

    def substitute(self, old: Var, new: Operand) -> None:
        """Every use of ``old`` (in nodes and outputs) now reads ``new``."""
        for node in self.nodes:
            node.ins = [new if op is old else op for op in node.ins]
        self.outputs = [new if op is old else op for op in self.outputs]

    def dce(self) -> "Program":
        """Drop nodes whose results never reach an output (dead computation)."""
        live: set[Var] = {op for op in self.outputs if isinstance(op, Var)}
        kept: list[Node] = []
        for node in reversed(self.nodes):
            if any(out in live for out in node.outs):
                kept.append(node)
                live.update(op for op in node.ins if isinstance(op, Var))
        self.nodes = list(reversed(kept))
        return self


def read(env: dict[Var, Any], op: Operand) -> Any:
    if isinstance(op, Const):
        return np.asarray(op.value, dtype=op.dtype) if op.shape or not op.weak else op.value
    return env[op]


def run_program(program: Program, args: list[Any]) -> Any:
    """``program`` on ``args`` (arrays or tracers: under a trace this writes its equations), its results in
    the reference's output structure."""
    env: dict[Var, Any] = dict(zip(program.inputs, args))
    for node in program.nodes:
        out = node.primitive.bind(*[read(env, op) for op in node.ins], **node.params)
        env.update(zip(node.outs, out if node.primitive.multiple_results else [out]))
    outs = [read(env, op) for op in program.outputs]
    return outs[0] if program.out_tree is None else jax.tree_util.tree_unflatten(program.out_tree, outs)


class ProgramBuilder:
    """Flattens a closed jaxpr into a Program, inlining calls."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self.counter = itertools.count()

    def var(self, aval: Any, origin: tuple[str, int] | None = None) -> Var:
        return Var(f"v{next(self.counter)}", tuple(int(d) for d in aval.shape), _dtype(aval.dtype), origin)

    def build(self, closed: core.ClosedJaxpr, names: list[str]) -> Program:
        jaxpr = closed.jaxpr
        inputs = [Var(name, tuple(int(d) for d in v.aval.shape), np.dtype(v.aval.dtype)) for name, v in zip(names, jaxpr.invars)]
        env: dict[core.Var, Operand] = dict(zip(jaxpr.invars, inputs))
        env.update((cv, _const(c)) for cv, c in zip(jaxpr.constvars, closed.consts))
        outs = self._inline(jaxpr, env)
        return Program(inputs, self.nodes, outs)

    def _operand(self, env: dict[core.Var, Operand], atom: Any) -> Operand:
        if isinstance(atom, core.Literal):
            return Const(atom.val, tuple(np.shape(atom.val)), np.dtype(atom.aval.dtype), bool(getattr(atom.aval, "weak_type", False)))
        return env[atom]

    def _inline(self, jaxpr: core.Jaxpr, env: dict[core.Var, Operand]) -> list[Operand]:
        for eqn in jaxpr.eqns:
            ins = [self._operand(env, a) for a in eqn.invars]
            body = _callee(eqn)
            if body is not None:
                sub_env: dict[core.Var, Operand] = dict(zip(body.jaxpr.invars, ins))
                sub_env.update((cv, _const(c)) for cv, c in zip(body.jaxpr.constvars, body.consts))
                results = self._inline(body.jaxpr, sub_env)
                env.update(zip(eqn.outvars, results))
                continue
            where = source_line(eqn)
            outs = [self.var(v.aval, where) for v in eqn.outvars]
            self.nodes.append(Node(eqn.primitive, ins, outs, dict(eqn.params), where))
            env.update(zip(eqn.outvars, outs))
        return [self._operand(env, a) for a in jaxpr.outvars]


_OWN_DIR = str(Path(__file__).resolve().parents[1]) + "/"


def source_line(eqn: core.JaxprEqn) -> tuple[str, int] | None:
    """The user line that traced ``eqn`` (the reference's), or None; MaxKernel's own lines do not count:
    they belong to a rewrite, not to the code a reader compares the kernel with."""
    frame = source_info_util.user_frame(eqn.source_info.traceback)
    if frame is None or frame.file_name.startswith(_OWN_DIR):
        return None
    return frame.file_name, int(frame.start_line)


def _dtype(dtype: Any) -> Any:
    """A numpy dtype, or JAX's own for extended types (PRNG keys) that numpy cannot name."""
    return dtype if jax.dtypes.issubdtype(dtype, jax.dtypes.extended) else np.dtype(dtype)


def _callee(eqn: core.JaxprEqn) -> core.ClosedJaxpr | None:
    if eqn.primitive.name not in INLINED:
        return None
    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        sub = eqn.params.get(key)
        if isinstance(sub, core.ClosedJaxpr):
            return sub
        if isinstance(sub, core.Jaxpr):
            return core.ClosedJaxpr(sub, ())
    return None


def _const(value: Any) -> Const:
    arr = np.asarray(value)
    return Const(arr, tuple(arr.shape), arr.dtype, False)


def arg_names(task: "Task") -> list[str]:
    """The reference's positional parameter names (``x``, ``weight`` ...), used as input names: those its
    arguments fill (a trailing ``eps=1e-6`` that ``get_inputs`` does not pass is a constant, not an input)."""
    params = [p for p in inspect.signature(task.reference).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if params and params[-1].default is not inspect.Parameter.empty:
        count = len(input_shapes(task, "cpu"))
        if count < len(params) and all(p.default is not inspect.Parameter.empty for p in params[count:]):
            params = params[:count]
    return [p.name for p in params]


def trace_program(task: "Task", size: str = "cpu", shapes: list[Any] | None = None) -> Program:
    """Trace the reference at ``size`` (or at the given abstract argument shapes) into a Program.

    Shapes are taken from ``jax.eval_shape`` of ``get_inputs``: nothing is allocated.
    """
    static = static_args(task, size)
    if shapes is None:
        shapes = list(input_shapes(task, size))
    closed, out_shape = jax.make_jaxpr(functools.partial(task.reference, **static), return_shape=True)(*shapes)
    names = arg_names(task)
    names = names + [f"arg{i}" for i in range(len(names), len(shapes))]
    program = ProgramBuilder().build(closed, names[: len(shapes)])
    program.out_tree = jax.tree_util.tree_structure(out_shape)
    program.dim_names = size_names(task.size(size) if size in task.spec.sizes else {}, names)
    from maxkernel.analysis.statics import mark_statics

    mark_statics(program, task.reference, static, shapes, names[: len(shapes)])
    return program


def probe_sizes(task: "Task", size: str = "cpu") -> list[tuple["Task", str]]:
    """A size that emitters trace beside ``size`` to tell an extent that follows a free parameter (a batch
    of one) from a literal or another extent of the same value: each free parameter moved up by its own
    number of grid steps (one for the first, two for the second...), so that no two move alike (a batch and
    a chunk count both 2 become 3 and 4), or down where the task's maximum leaves no room. Empty when the
    task has no free parameter."""
    import random

    if not task.spec.free:
        return []
    values = task.size(size)
    below = task.draw_unseen(size, random.Random(0))
    for steps, (name, free) in enumerate(task.spec.free.items(), start=1):
        value = int(values[name]) + steps * free.multiple_of
        values[name] = value if free.max is None or value <= free.max else below[name]
    return [(task.with_size(f"{size}_probe", values), f"{size}_probe")]


def doubled_sizes(task: "Task") -> dict[str, dict[str, Any]]:
    """``cpu`` with one integer size parameter doubled, one size per parameter: traced only, so that an extent
    equal to another at the task's own sizes (``seq`` = ``hidden`` at ``cpu``, a width equal to heads times
    head_dim) is not written from it."""
    cpu = task.size("cpu")
    return {f"probe_{name}": {**cpu, name: 2 * value} for name, value in cpu.items()
            if isinstance(value, int) and not isinstance(value, bool) and value >= 1}


def trace_probes(task: "Task", size: str = "cpu") -> list[Program]:
    """The reference traced at each of :func:`probe_sizes`."""
    return [trace_program(*probe) for probe in probe_sizes(task, size)]


def size_names(values: dict[str, Any], taken: list[str]) -> dict[int, str]:
    """Each integer size parameter above 1 by its value, where no other parameter shares the value (a
    shared value could be either, so it is named by the axis it is read from instead)."""
    counts: dict[int, int] = {}
    for value in values.values():
        if isinstance(value, int) and not isinstance(value, bool):
            counts[value] = counts.get(value, 0) + 1
    return {int(v): name for name, v in values.items()
            if isinstance(v, int) and not isinstance(v, bool) and v > 1 and counts[v] == 1
            and name.isidentifier() and name not in taken}


# (task folder, source digest, size, redrawn statics) -> (abstract argument shapes, static arguments)
_INPUT_INFO: dict[tuple[str, str, str, str], tuple[tuple[Any, ...], dict[str, Any]]] = {}


def _input_info(task: "Task", size: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
    key = (str(task.path), task.source_digest, size, repr(sorted(task.static_overrides.items())))
    if key not in _INPUT_INFO:
        holder: dict[str, Any] = {}

        def draw(k: Any) -> Any:
            args, static = task.get_inputs(k, size)
            holder["static"] = static
            return args

        shapes = jax.eval_shape(draw, jax.random.key(0))
        _INPUT_INFO[key] = (tuple(shapes), dict(holder["static"]))
    return _INPUT_INFO[key]


def input_shapes(task: "Task", size: str = "cpu") -> tuple[jax.ShapeDtypeStruct, ...]:
    return _input_info(task, size)[0]


def static_args(task: "Task", size: str = "cpu") -> dict[str, Any]:
    return dict(_input_info(task, size)[1])
