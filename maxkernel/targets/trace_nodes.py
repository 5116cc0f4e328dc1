"""Optimization traces of measured TPU programs, read as data and turned into tasks and candidates to price.

A trace file is one nested Python expression ``CodeCandidate(parent=CodeCandidate(...), code='''...''',
score=X, ...)``: each node is a complete program (``CONFIG`` with its shapes, ``create_inputs()``,
``workload(*inputs)``) and its measured device latency in ms. The file is parsed with :mod:`ast` and only
literal values are read from it: nothing in it is executed here. A node's program runs only where a candidate
runs, inside the evaluator's sandbox.

The adapter: the chain's first node becomes the task's reference (``get_inputs`` returns ``create_inputs()``,
``reference`` is ``workload``), and every node becomes a candidate whose ``kernel`` is its ``workload``, so
each is priced at the shapes it was measured at. Programs written for older JAX releases get the
:data:`SHIMS` they need (plain text renames), and each node records the ones applied to it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from pydantic import BaseModel

from maxkernel.targets.names import TargetError


class TraceError(TargetError):
    """A trace file that cannot be read as a chain of measured programs."""


class TraceNode(BaseModel):
    """One measured program of a trace: its position along the chain (0 = the start), source and latency."""

    trace: str
    index: int
    code: str
    measured_ms: float | None


class Shim(BaseModel):
    """A rename of an API that moved between JAX releases, applied to a node's source as text: every match of
    the regular expression ``old`` becomes ``new``; ``helper`` (if any) is appended to the program once."""

    name: str
    old: str
    new: str
    helper: str = ""


# pltpu.repeat(x, n, axis) of older releases: n copies of x joined along axis (Mosaic's tpu.repeat).
_REPEAT_HELPER = '''

def _shim_pltpu_repeat(x, repeats, axis):
    import jax.numpy as _jnp
    return _jnp.concatenate([x] * repeats, axis=axis)
'''

# pl.store(ref, idx, val, mask=...) of older releases: a (masked) store into the window idx of ref.
_STORE_HELPER = '''

def _shim_pl_store(ref, idx, val, mask=None):
    from jax.experimental.pallas import tpu as _pltpu
    if mask is None:
        ref[idx] = val
    else:
        _pltpu.store(ref.at[idx], val, mask=mask)
'''

SHIMS: tuple[Shim, ...] = (
    Shim(name="pltpu.TPUCompilerParams->CompilerParams", old=r"\bpltpu\.TPUCompilerParams\b",
         new="pltpu.CompilerParams"),
    Shim(name="pltpu.TPUMemorySpace->MemorySpace", old=r"\bpltpu\.TPUMemorySpace\b", new="pltpu.MemorySpace"),
    Shim(name="pltpu.ANY->pl.ANY", old=r"\bpltpu\.ANY\b", new="pl.ANY"),
    Shim(name="dtypes.bit_width->dtypes.itemsize_bits", old=r"\bdtypes\.bit_width\(",
         new="dtypes.itemsize_bits("),
    Shim(name="pltpu.repeat->concatenate", old=r"\bpltpu\.repeat\(", new="_shim_pltpu_repeat(",
         helper=_REPEAT_HELPER),
    Shim(name="pl.store->pltpu.store", old=r"\bpl\.store\(", new="_shim_pl_store(", helper=_STORE_HELPER),
)

ADAPTER_REFERENCE = '''

# --- adapter: the measured program as a task (inputs at the published shapes; the program's own output) ---
def get_inputs(key, **_size):
    return tuple(create_inputs()), {}


def reference(*args):
    return workload(*args)
'''

ADAPTER_CANDIDATE = '''

# --- adapter: the measured program as a candidate ---
def kernel(*args):
    return workload(*args)
'''

TASK_YAML = """\
id: {id}
name: {name}
category: {category}
description: A measured program of the trace {trace}, as published, at its published shapes.
dtype: bfloat16
tolerance: {{atol: 2.0e-2, rtol: 2.0e-2}}
sizes:
  cpu: {{}}
  full: {{}}
"""


def read_trace(path: Path) -> list[TraceNode]:
    """The nodes of one trace file, start first. Raises TraceError (one line) on anything else."""
    name = path.name.removesuffix(".py").removesuffix("_trace")
    try:
        tree = ast.parse(path.read_text(), mode="eval")
    except (OSError, SyntaxError, ValueError) as exc:
        raise TraceError(f"{path}: not a trace expression: {type(exc).__name__}: {exc}") from exc
    node: ast.expr | None = tree.body
    chain: list[TraceNode] = []
    while node is not None:
        if not isinstance(node, ast.Call):
            raise TraceError(f"{path}: node {len(chain)} from the end is not a call expression")
        fields = {kw.arg: kw.value for kw in node.keywords}
        if "code" not in fields or "parent" not in fields:
            raise TraceError(f"{path}: node {len(chain)} from the end has no code= or parent=")
        try:
            code = ast.literal_eval(fields["code"])
            score = ast.literal_eval(fields["score"]) if "score" in fields else None
        except ValueError as exc:
            raise TraceError(f"{path}: node {len(chain)} from the end: code or score is not a literal") from exc
        if not isinstance(code, str) or not (score is None or isinstance(score, (int, float))):
            raise TraceError(f"{path}: node {len(chain)} from the end: code must be text and score a number")
        chain.append(TraceNode(trace=name, index=0, code=code, measured_ms=None if score is None else float(score)))
        parent = fields["parent"]
        node = None if isinstance(parent, ast.Constant) and parent.value is None else parent
    chain.reverse()
    for index, item in enumerate(chain):
        item.index = index
    _check_programs(path, chain)
    return chain


def _check_programs(path: Path, chain: list[TraceNode]) -> None:
    for item in chain:
        try:
            body = ast.parse(item.code).body
        except SyntaxError as exc:
            raise TraceError(f"{path}: node {item.index}: its code does not parse: {exc}") from exc
        names = {n.name for n in body if isinstance(n, ast.FunctionDef)}
        names |= {t.id for n in body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
        missing = {"CONFIG", "create_inputs", "workload"} - names
        if missing:
            raise TraceError(f"{path}: node {item.index}: its code defines no {', '.join(sorted(missing))}")


def find_traces(folder: Path) -> list[Path]:
    """The trace files of a folder (``*_trace.py``), sorted by name."""
    if not folder.is_dir():
        raise TraceError(f"{folder}: not a folder")
    found = sorted(folder.glob("*_trace.py"))
    if not found:
        raise TraceError(f"{folder}: no *_trace.py files")
    return found


def apply_shims(code: str) -> tuple[str, list[str]]:
    """The code with every applicable rename applied, and the names of those applied."""
    applied = []
    for shim in SHIMS:
        code, count = re.subn(shim.old, shim.new, code)
        if count:
            code += shim.helper
            applied.append(shim.name)
    return code, applied


def write_task(folder: Path, start: TraceNode) -> Path:
    """A task folder whose reference is the trace's first program, at its published shapes."""
    folder.mkdir(parents=True, exist_ok=True)
    code, _ = apply_shims(start.code)
    category = "attention"  # each is an attention-like operator; the category only labels the task
    (folder / "task.yaml").write_text(TASK_YAML.format(
        id=f"trace_{start.trace}", name=start.trace, category=category, trace=start.trace))
    (folder / "reference.py").write_text(code + ADAPTER_REFERENCE)
    return folder


def candidate_source(node: TraceNode) -> tuple[str, list[str]]:
    """The node's program as a candidate (``kernel`` = its ``workload``), and the shims applied."""
    code, applied = apply_shims(node.code)
    return code + ADAPTER_CANDIDATE, applied
