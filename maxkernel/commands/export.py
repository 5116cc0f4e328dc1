"""``maxkernel export SESSION|TASK... [--out DIR]``: verified kernels as a package a model can import.

Each kernel becomes a module holding the kernel under the reference's own signature and docstring, the
tuned table of its strategy (the entries memory's parameter priors read, by chip and shape class), what
it supports, and a test that checks it against a copy of the reference at a few sizes. The package
imports only JAX: neither MaxKernel nor JaxBench is needed where it is used.
"""

from __future__ import annotations

import ast
import inspect
import keyword
import random
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer
from pydantic import BaseModel, Field
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from jaxbench.report import format_speedup

if TYPE_CHECKING:
    from jaxbench.task import Task
    from memory import Store
    from memory.models import KernelRecord

BLOCK_CONSTANT = re.compile(r"^(BLOCK_[A-Z0-9_]+) = (\d+)(.*)$", re.MULTILINE)
SERVED_SHAPES = re.compile(r"^\s+if shapes == (\(.*\)):$", re.MULTILINE)
TEST_DRAWS = 2  # sizes drawn from the free parameters, beside the declared cpu size


class Supports(BaseModel):
    """What an exported kernel serves, as the evidence shows it."""

    shapes: str
    sizes: list[dict[str, Any]] = Field(description="the sizes its test checks")
    dtypes: list[str]
    chips: list[str]
    forward_only: bool = True


class Exported(BaseModel):
    task_id: str
    function: str
    module: str
    strategy: str
    speedup: float | None = None
    speedup_ci: tuple[float, float] | None = None
    supports: Supports

    def speed(self) -> str:
        """The kernel's reading with its interval: the figure said everywhere else of the same kernel."""
        return format_speedup(self.speedup, self.speedup_ci)


def export_command(
    subjects: list[str] = typer.Argument(..., help="tasks (suite ids or folders) or session ids"),
    out: Path = typer.Option(Path("exported"), help="folder the package is written into"),
    name: Optional[str] = typer.Option(None, help="package name (default: the kernel's name, or 'kernels')"),
    target: str = typer.Option("cpu", help="the target whose best kernel a task exports"),
) -> None:
    """Write the best kernels in memory as one importable package with its own tests."""
    from maxkernel.cli import guarded

    guarded(_export)(subjects, out, name, target)


def _export(subjects: list[str], out: Path, name: Optional[str], target: str) -> None:
    from maxkernel.cli import UserError
    from maxkernel.commands.checks import check_folder, check_target
    from maxkernel.config import load_settings
    from memory import Store

    check_target(target)
    check_folder(out, "--out")
    if name is not None and not _identifier(name):
        raise UserError(f"--name {name}: not a Python package name")
    with Store.open(load_settings().resolved_store_url) as store:
        chosen = [_subject(store, s, target) for s in subjects]
        package, done = write_package(store, chosen, out, name)
    _print(package, done)


def _identifier(name: str) -> bool:
    return name.isidentifier() and not keyword.iskeyword(name)


def _subject(store: "Store", subject: str, target: str) -> tuple["Task", "KernelRecord"]:
    """A task's best verified kernel on ``target``, or a session's best kernel."""
    from jaxbench.task import TaskError, load_task
    from maxkernel.cli import UserError
    from memory.errors import RecordNotFoundError

    try:
        task = load_task(subject)
    except TaskError:
        task = None
    if task is not None:
        kernels = store.list_kernels(task_id=task.id, target=target, limit=None)
        if not kernels:
            raise UserError(f"{subject}: memory holds no verified kernel of this task for {target} "
                            f"(run maxkernel optimize {subject} --target {target} first)")
        return task, max(kernels, key=_rank)
    try:
        _kind, full = store.resolve(subject, ("session",))
    except RecordNotFoundError as exc:
        raise UserError(f"{subject}: not a task, and {exc}") from exc
    session = store.get_session(full)
    kernels = [k for k in store.list_kernels(task_id=session.task_id, limit=None) if k.session_id == full]
    if not kernels:
        raise UserError(f"session {full[:12]}: remembered no verified kernel (the reference may have won)")
    best = max(kernels, key=_rank)
    return load_task(best.task_id), best


def _rank(record: "KernelRecord") -> float:
    interval = record.report.speedup_ci
    return float(interval[0]) if interval else float(record.speedup or 0.0)


def snake(text: str) -> str:
    """``Gemm_Divide_Sum_Scaling`` -> ``gemm_divide_sum_scaling``: a module and function name."""
    name = re.sub(r"[^0-9a-zA-Z]+", "_", re.sub(r"(?<=[a-z0-9])(?=[A-Z][a-z])", "_", text)).strip("_").lower()
    name = name or "kernel"
    if name[0].isdigit() or keyword.iskeyword(name):
        name = "k_" + name
    return name


def write_package(store: "Store", chosen: list[tuple["Task", "KernelRecord"]], out: Path,
                  name: str | None) -> tuple[Path, list[Exported]]:
    """``out/<package>/``: ``__init__.py``, a module per kernel, its reference copy and its test."""
    from memory.insights import JUDGED, PLANNED, TUNED, measurements_from_events
    from maxkernel.tuning.table import TunedTable

    modules = [_unique(snake(task.spec.name or task.id), i, chosen) for i, (task, _) in enumerate(chosen)]
    package_name = name or (modules[0] if len(chosen) == 1 else "kernels")
    package = out / package_name
    package.mkdir(parents=True, exist_ok=True)
    events = store.events_of([PLANNED, *JUDGED, TUNED], task_ids=sorted({t.id for t, _ in chosen}))
    table = TunedTable.from_rows(measurements_from_events(events))
    done: list[Exported] = []
    for module, (task, record) in zip(modules, chosen):
        tuned = table.keyed(record.strategy, task.id)
        supports = supported(task, record, tuned)
        (package / f"{module}.py").write_text(kernel_module(task, record, module, tuned, supports))
        (package / f"_reference_{module}.py").write_text(task.reference_path.read_text())
        (package / f"test_{module}.py").write_text(test_module(task, module, supports))
        done.append(Exported(task_id=task.id, function=module, module=f"{package_name}.{module}",
                             strategy=record.strategy, speedup=record.speedup, speedup_ci=record.report.interval,
                             supports=supports))
    lines = [f'"""Kernels exported by MaxKernel: {", ".join(e.task_id for e in done)}."""', ""]
    lines += [f"from .{e.function} import {e.function}" for e in done]
    lines += ["", f"__all__ = {[e.function for e in done]!r}", ""]
    (package / "__init__.py").write_text("\n".join(lines))
    return package, done


def _unique(module: str, index: int, chosen: list[tuple["Task", "KernelRecord"]]) -> str:
    earlier = [snake(t.spec.name or t.id) for t, _ in chosen[:index]]
    return module if module not in earlier else f"{module}_{earlier.count(module) + 1}"


def supported(task: "Task", record: "KernelRecord", tuned: dict[tuple[str, str], dict[str, Any]]) -> Supports:
    """Shapes (from the kernel's own dispatch and the evaluator's unseen-size check), dtypes, chips."""
    from maxkernel.analysis.program import input_shapes

    served = [ast.literal_eval(m) for m in SERVED_SHAPES.findall(record.code)]
    refuses = "serves argument shapes" in record.code
    unseen = record.report.check("correct_unseen_size")
    base = task.size("cpu")
    if refuses:
        shapes = f"only the argument shapes it was rendered for: {served}; any other shape is refused"
        sizes = [base]
    else:
        free = ", ".join(task.spec.free) or "none declared"
        if unseen is not None and unseen.passed:
            shapes = f"shapes read from its inputs; free sizes {free}; passed the evaluator at {unseen.detail}"
        else:
            shapes = f"shapes read from its inputs; free sizes {free} (not checked at an unseen size)"
        rng = random.Random(0)
        sizes = [base] + ([task.draw_unseen("cpu", rng) for _ in range(TEST_DRAWS)] if task.spec.free else [])
    dtypes = sorted({str(s.dtype) for s in input_shapes(task, "cpu")})
    chips = sorted({record.target} | {chip for chip, _ in tuned})
    return Supports(shapes=shapes, sizes=sizes, dtypes=dtypes, chips=chips)


def _signature(task: "Task") -> tuple[str, str]:
    """The reference's parameter list (defaults kept where they are literals) and the call forwarding it."""
    params = inspect.signature(task.reference).parameters.values()
    parts, call, star = [], [], False
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            prefix = "*" if p.kind == p.VAR_POSITIONAL else "**"
            parts.append(prefix + p.name)
            call.append(prefix + p.name)
            star = star or p.kind == p.VAR_POSITIONAL
            continue
        if p.kind == p.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        text = p.name
        if p.default is not p.empty and _literal(p.default):
            text += f"={p.default!r}"
        parts.append(text)
        call.append(f"{p.name}={p.name}" if p.kind == p.KEYWORD_ONLY else p.name)
    return ", ".join(parts), ", ".join(call)


def _literal(value: Any) -> bool:
    try:
        return ast.literal_eval(repr(value)) == value
    except (ValueError, SyntaxError):
        return False


def _split_docstring(code: str) -> tuple[str, str]:
    """(the candidate's module docstring, the rest of its source)."""
    tree = ast.parse(code)
    first = tree.body[0] if tree.body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        lines = code.splitlines(keepends=True)
        return first.value.value, "".join(lines[first.end_lineno:])
    return "", code


def kernel_module(task: "Task", record: "KernelRecord", function: str, tuned: dict[tuple[str, str], dict[str, Any]],
                  supports: Supports) -> str:
    """The module's source: docstring, the verified kernel, its tuned table and the public function."""
    doc = inspect.getdoc(task.reference) or (task.module.__doc__ or "").strip()
    candidate_doc, body = _split_docstring(record.code)
    mine = tuned.get((record.target, _own_class(record, tuned)), {})
    body = BLOCK_CONSTANT.sub(lambda m: _tied(m, mine, record.target, _own_class(record, tuned)), body)
    tied = "TUNED[(" in body
    pallas = "pallas" in record.code
    params, call = _signature(task)
    table_lines = ["TUNED = {"] + [f"    {key!r}: {value!r}," for key, value in sorted(tuned.items())] + ["}"]
    lines = [
        f'"""{task.id}: {doc.splitlines()[0] if doc else task.spec.name}',
        "",
        f"Exported by MaxKernel from a verified {record.strategy} kernel ({record.target}; "
        f"speedup {format_speedup(record.speedup, record.report.interval)}).",
        f"Shapes: {supports.shapes}.",
        f"Dtypes: {', '.join(supports.dtypes)}. Chips: {', '.join(supports.chips)}. "
        "Forward only: no gradient rule is defined.",
        "",
        *(candidate_doc.strip().splitlines()),
        '"""',
        "",
        *body.strip("\n").splitlines(),
        "",
        "# Tuned configurations of this kernel's strategy, by (chip or cpu, shape class): the entries of",
        "# MaxKernel's memory that its parameter priors read." + (" The block constants above read this kernel's"
                                                                  " own entry." if tied else ""),
        *table_lines,
        f"TARGET = {record.target!r}",
        f"SUPPORTS = {supports.model_dump()!r}",
        "",
        "",
        f"def {function}({params}):",
        f'    """{_escape_doc(doc)}"""' if doc else f'    """{task.id}."""',
    ]
    if pallas:
        lines += [
            "    if jax.default_backend() == 'cpu':  # no TPU here: Pallas runs interpreted, with TPU semantics",
            "        from jax.experimental.pallas import tpu as _pltpu",
            "",
            "        with _pltpu.force_tpu_interpret_mode():",
            f"            return kernel({call})",
        ]
    lines.append(f"    return kernel({call})")
    return "\n".join(lines) + "\n"


def _own_class(record: "KernelRecord", tuned: dict[tuple[str, str], dict[str, Any]]) -> str:
    """The shape class of the exported kernel's own table entry (the best of its chip)."""
    classes = [cls for chip, cls in tuned if chip == record.target]
    return classes[0] if len(classes) == 1 else ""


def _tied(match: re.Match[str], mine: dict[str, Any], target: str, cls: str) -> str:
    """``BLOCK_Q = 128`` read from the table when the table's entry holds that very value (only a
    configuration the evaluator checked is ever run)."""
    constant, value, rest = match.group(1), int(match.group(2)), match.group(3)
    param = constant.lower()
    if mine.get(param) == value:
        return f"{constant} = TUNED[({target!r}, {cls!r})][{param!r}]{rest}"
    return match.group(0)


def _escape_doc(doc: str) -> str:
    return doc.replace('"""', r'\"\"\"').replace("\n", "\n    ")


def test_module(task: "Task", function: str, supports: Supports) -> str:
    """A test of the kernel against the reference copy at the sizes ``supports`` names."""
    tol = task.spec.tolerance
    return f'''"""Checks {function} against the reference it was exported from, at {len(supports.sizes)} sizes.

Run: python -m <package>.test_{function}   (or pytest)
"""

import jax
import numpy as np

from . import _reference_{function} as reference
from .{function} import {function}

SIZES = {supports.sizes!r}
ATOL, RTOL = {tol.atol!r}, {tol.rtol!r}


def test_{function}():
    for seed, size in enumerate(SIZES):
        args, static = reference.get_inputs(jax.random.key(seed), **size)
        want = jax.tree_util.tree_leaves(reference.reference(*args, **static))
        got = jax.tree_util.tree_leaves({function}(*args, **static))
        assert len(got) == len(want), f"{{size}}: {{len(got)}} outputs, expected {{len(want)}}"
        for w, g in zip(want, got):
            assert g.shape == w.shape and g.dtype == w.dtype, f"{{size}}: {{g.shape}} {{g.dtype}} vs {{w.shape}} {{w.dtype}}"
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=ATOL, rtol=RTOL, err_msg=str(size))


if __name__ == "__main__":
    test_{function}()
    print("ok: {function} matches the reference at", len(SIZES), "sizes")
'''


def _print(package: Path, done: list[Exported]) -> None:
    """One two-column table per kernel (what, value): the ids and module names a user copies stay whole and on
    one line at 80 columns, which eight columns side by side cannot promise."""
    console = Console()
    console.print(f"exported to {package}", highlight=False, soft_wrap=True)
    for e in done:
        s = e.supports
        table = Table(show_header=False)
        table.add_column("what", no_wrap=True)
        table.add_column("value", overflow="fold")
        for what, value in (("task", e.task_id), ("function", e.module), ("strategy", e.strategy),
                            ("speedup", e.speed()), ("shapes", s.shapes),
                            ("dtypes", ", ".join(s.dtypes)), ("chips", ", ".join(s.chips)),
                            ("gradients", "forward only")):
            table.add_row(what, escape(value))
        console.print(table)
    console.print(f"test: python -m {package.name}.test_{done[0].function} (from {package.parent})", highlight=False)
