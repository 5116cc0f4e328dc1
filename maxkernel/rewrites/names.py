"""Names for emitted values, so that a kernel reads next to its reference line by line.

A value keeps the name the reference gave it: each node knows the reference line that traced it, and the
reference's source, parsed with ``ast``, says which name that line assigns. A value the reference never
named (an intermediate of a line, or one a rewrite made) is named by what it is (``row_sum``, ``scores``,
``x_f32``), or takes over its operand's name when it replaces that operand (``h = h / 2.0``), as a person
writes it. Names are only reused once the value holding them is no longer read.
"""

from __future__ import annotations

import ast
import builtins
import functools
import keyword
import os
import re
from collections.abc import Iterable

import numpy as np

from maxkernel.analysis.program import Node, Program, Var

# Module aliases and helpers that emitted files use: a local of that name would hide them.
RESERVED = frozenset({"jax", "jnp", "np", "lax", "pl", "pltpu", "math", "functools", "kernel", "static", "shapes"})
ELEMENTWISE_KEEPING = frozenset({
    "add", "sub", "mul", "div", "max", "min", "pow", "neg", "integer_pow", "exp", "exp2", "log", "log1p", "expm1",
    "tanh", "logistic", "rsqrt", "sqrt", "abs", "square", "erf", "erfc", "sin", "cos", "floor", "ceil", "round",
    "sign", "reciprocal", "clamp", "select_n", "convert_element_type", "atan2", "cbrt", "rem"})
WORDS = {
    "exp": "exp", "exp2": "exp2", "log": "log", "log1p": "log1p", "expm1": "expm1", "tanh": "tanh",
    "logistic": "sigmoid", "rsqrt": "inv_sqrt", "sqrt": "root", "abs": "magnitude", "square": "squared",
    "erf": "erf", "erfc": "erfc", "sin": "sine", "cos": "cosine", "max": "maximum", "min": "minimum",
    "add": "total", "sub": "difference", "mul": "product", "div": "ratio", "neg": "negated", "pow": "power",
    "integer_pow": "power", "select_n": "selected", "clamp": "clamped", "iota": "positions", "gather": "gathered",
    "concatenate": "joined", "pad": "padded", "slice": "part", "dynamic_slice": "window", "cumsum": "running_sum",
    "cummax": "running_max", "argmax": "index", "argmin": "index", "conv_general_dilated": "conv", "top_k": "top",
    "lt": "mask", "le": "mask", "gt": "mask", "ge": "mask", "eq": "mask", "ne": "mask", "and": "mask", "or": "mask",
    "not": "mask", "is_finite": "finite", "random_bits": "bits", "random_wrap": "key", "random_unwrap": "key_data",
    "rem": "remainder", "round": "rounded", "floor": "floored", "ceil": "ceiled", "sign": "signs",
}
REDUCED = {"reduce_sum": "sum", "reduce_max": "max", "reduce_min": "min", "reduce_prod": "prod",
           "reduce_and": "all", "reduce_or": "any"}
SHORT_DTYPES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64", "int32": "i32",
                "int8": "i8", "int64": "i64", "uint32": "u32", "bool": "mask"}
LONGEST_DERIVED = 20
MACHINE_NAME = re.compile(r"^[vt]\d+$")  # what the program builder and rewrites call a value


@functools.lru_cache(maxsize=128)
def _assignments(path: str, mtime: float) -> dict[int, str]:
    """Line -> the one plain name its statement assigns (``h = ...``, ``h += ...``, ``h: T = ...``)."""
    try:
        with open(path, encoding="utf-8") as handle:
            tree = ast.parse(handle.read())
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return {}
    found: dict[int, str] = {}
    for node in ast.walk(tree):
        target: ast.expr | None = None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            target = node.target
        if isinstance(target, ast.Name):
            for line in range(node.lineno, (node.end_lineno or node.lineno) + 1):
                found[line] = target.id
    return found


def assigned_name(source: tuple[str, int] | None) -> str | None:
    """The name the reference assigns on ``source``'s line, or None (a return, an expression, a tuple)."""
    if source is None:
        return None
    path, line = source
    try:
        mtime = os.stat(path).st_mtime
    except OSError:  # a reference that cannot be read here (a sandboxed process) names nothing
        return None
    return _assignments(path, mtime).get(line)


def clean(name: str) -> str:
    """An identifier no emitted helper, module alias, keyword or builtin uses."""
    name = re.sub(r"\W", "_", name).strip("_") or "value"
    if name[0].isdigit():
        name = "v_" + name
    if keyword.iskeyword(name) or name in RESERVED or hasattr(builtins, name):
        name += "_"
    return name


class Namer:
    """Display names for one program's values, decided once in program order."""

    def __init__(self, program: Program, fixed: Iterable[str] = (), rename_inputs: bool = False) -> None:
        self.program = program
        self.names: dict[int, str] = {id(v): v.name for v in program.inputs}
        self.fixed = set(fixed)  # names that stay bound for the whole function (the hoisted dimensions)
        self._holder: dict[str, Var] = {v.name: v for v in program.inputs}
        self._last = self._last_reads()
        if rename_inputs:  # a function's parameters that are another program's values: their reference names
            self._name_inputs()
        self._assign()

    def _name_inputs(self) -> None:
        taken: set[str] = {v.name for v in self.program.inputs if not MACHINE_NAME.match(v.name)}
        for var in self.program.inputs:
            if MACHINE_NAME.match(var.name):
                del self._holder[var.name]
                self._take(var, assigned_name(var.origin) or "value", -1, taken)

    def __call__(self, var: Var) -> str:
        return self.names.get(id(var), var.name)

    def _last_reads(self) -> dict[int, float]:
        last: dict[int, float] = {}
        for index, node in enumerate(self.program.nodes):
            for op in node.ins:
                if isinstance(op, Var):
                    last[id(op)] = index
        for op in self.program.outputs:
            if isinstance(op, Var):
                last[id(op)] = float("inf")
        return last

    def _free(self, name: str, index: int) -> bool:
        if name in self.fixed:
            return False
        holder = self._holder.get(name)
        return holder is None or self._last.get(id(holder), -1) <= index

    def _take(self, var: Var, wanted: str, index: int, taken_here: set[str]) -> None:
        base = clean(wanted)
        name, n = base, 1
        while name in taken_here or not self._free(name, index):
            n += 1
            name = f"{base}_{n}"
        self.names[id(var)] = name
        self._holder[name] = var
        taken_here.add(name)

    def _assign(self) -> None:
        readers: dict[int, list[Node]] = {}
        for node in self.program.nodes:
            for op in node.ins:
                if isinstance(op, Var):
                    readers.setdefault(id(op), []).append(node)
        outputs = {id(op) for op in self.program.outputs if isinstance(op, Var)}
        for index, node in enumerate(self.program.nodes):
            taken_here: set[str] = set()
            for out in node.outs:
                leaves = id(out) in outputs or any(r.source != node.source for r in readers.get(id(out), []))
                named = assigned_name(node.source) if leaves and len(node.outs) == 1 else None
                self._take(out, named or self._describe(node, out, index), index, taken_here)

    def _describe(self, node: Node, out: Var, index: int) -> str:
        """A name for what ``out`` is, from the primitive and what it reads."""
        prim = node.prim
        values = node.ins[1:] if prim in ("select_n", "clamp") else node.ins  # not the predicate, nor the bounds
        if prim == "clamp":
            values = node.ins[1:2]
        if prim in ELEMENTWISE_KEEPING:
            for op in values:  # it replaces an operand of its shape read for the last time: keep that name
                if (isinstance(op, Var) and tuple(op.shape) == tuple(out.shape) and self._last.get(id(op), -1) <= index
                        and self(op) not in self.fixed):
                    return self(op)
        first = next((op for op in values if isinstance(op, Var)), None)
        operand = self(first) if first is not None else None
        if prim == "broadcast_in_dim" and first is None:
            return "filled"
        if prim == "convert_element_type" and first is None:
            return "constant"
        if prim in REDUCED:
            axes = tuple(int(a) for a in node.params.get("axes", ()))
            rank = len(first.shape) if first is not None else 0
            if axes == (rank - 1,) and rank > 1:
                return f"row_{REDUCED[prim]}"
            return self._derived(operand, REDUCED[prim], f"{REDUCED[prim]}_total")
        if prim == "dot_general":
            (lc, rc), (lb, _rb) = node.params["dimension_numbers"]
            a, b = node.ins
            if lb and tuple(lc) == (len(a.shape) - 1,) and tuple(rc) == (len(b.shape) - 1,):
                return "scores"
            return "product"
        if prim == "convert_element_type":
            short = SHORT_DTYPES.get(np.dtype(node.params["new_dtype"]).name, "cast")
            return self._derived(operand, short, short)
        if prim == "broadcast_in_dim":
            return self._derived(operand, "wide", "broadcast")
        if prim in ("reshape", "squeeze", "expand_dims"):
            return self._derived(operand, f"{len(out.shape)}d", "reshaped")
        if prim == "transpose":
            return self._derived(operand, "t", "transposed")
        return WORDS.get(prim, prim)

    @staticmethod
    def _derived(operand: str | None, suffix: str, fallback: str) -> str:
        if operand is None:
            return fallback
        root = re.sub(r"_\d+$", "", operand)
        name = f"{root}_{suffix}"
        return name if len(name) <= LONGEST_DERIVED else fallback
