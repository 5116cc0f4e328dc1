"""``maxkernel memory``: browse, search, move and check the memory from a terminal.

Mounted by the main CLI; also runnable alone as ``python -m memory.cli``. An error a user can cause
(bad settings, unreachable server, locked or corrupt store, bad import file, unknown id) ends in one
line on stderr and exit status 2, like every other command.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, NoReturn, cast

import structlog
import typer
from rich.console import Console
from rich.table import Table

from jaxbench.task import TaskError
from maxkernel.analysis.signature import SignatureError
from maxkernel.clierrors import USER_ERROR_EXIT, OneLineTyper
from maxkernel.commands.formatting import speedup_text
from maxkernel.config import ConfigError, load_settings
from memory.errors import MemoryStoreError, one_line
from memory.facade import Kind, Memory
from memory.models import KernelHit, KernelRecord, NoteHit, NoteRecord

USER_ERRORS = (MemoryStoreError, ConfigError, TaskError, SignatureError)

app = OneLineTyper(
    name="memory",
    help="The memory of verified kernels and optimization notes.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _console() -> Console:
    """Made per command, so that the terminal width (``COLUMNS``) is read when the command runs."""
    return Console()


@app.callback()
def _main() -> None:
    """Logs go to stderr at warning level unless the application configured structlog already."""
    if not structlog.is_configured():
        structlog.configure(
            wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
            logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        )


def _fail(exc: BaseException | str) -> NoReturn:
    """One line on stderr (other packages' errors may span several), then exit status 2."""
    typer.echo(f"error: {one_line(exc)}", err=True)
    raise typer.Exit(USER_ERROR_EXIT)


@contextmanager
def _memory(for_reindex: bool = False) -> Iterator[Memory]:
    try:
        memory = Memory.open(load_settings(), for_reindex=for_reindex)
    except USER_ERRORS as exc:
        _fail(exc)
    try:
        yield memory
    except USER_ERRORS as exc:
        _fail(exc)
    finally:
        memory.close()


def _kernel_table(title: str) -> Table:
    table = Table(title=title)
    table.add_column("id", no_wrap=True, min_width=12)
    for column in ("task", "target", "speedup", "strategy", "pattern"):
        table.add_column(column, overflow="fold")
    table.add_column("created", no_wrap=True)
    return table


def _kernel_row(table: Table, k: KernelRecord, score: float | None = None) -> None:
    cells = [k.id[:12], k.task_id, k.target, speedup_text(k.speedup, k.report.interval), k.strategy or "-",
             k.pattern or "-"]
    cells.append(f"{score:.3f}" if score is not None else k.created_at.strftime("%Y-%m-%d %H:%M"))
    table.add_row(*cells)


def _note_table(title: str) -> Table:
    table = Table(title=title)
    table.add_column("id", no_wrap=True, min_width=12)
    for column in ("outcome", "task", "target", "note"):
        table.add_column(column, overflow="fold")
    table.add_column("created", no_wrap=True)
    return table


def _note_row(table: Table, n: NoteRecord, score: float | None = None) -> None:
    last = f"{score:.3f}" if score is not None else n.created_at.strftime("%Y-%m-%d %H:%M")
    table.add_row(n.id[:12], n.outcome, n.task_id or "-", n.target or "-", n.text, last)


def _check_target(name: str) -> None:
    """An unknown target matches nothing: said as an error, not as an empty table."""
    from maxkernel.targets.names import TargetError, parse_target

    try:
        parse_target(name)
    except TargetError as exc:
        _fail(exc)


@app.command("list")
def list_(
    kind: Annotated[str, typer.Option(help="kernels, notes or all")] = "all",
    task: Annotated[str | None, typer.Option(help="only this task id")] = None,
    target: Annotated[str | None, typer.Option(help="only kernels for this target")] = None,
    limit: Annotated[int, typer.Option(min=1, help="rows per table")] = 20,
) -> None:
    """The newest kernels and notes."""
    if kind not in ("all", "kernels", "notes"):
        _fail(f"--kind must be kernels, notes or all, not {kind!r}")
    if target is not None:
        _check_target(target)
    with _memory() as memory:
        if kind in ("all", "kernels"):
            table = _kernel_table("kernels")
            for k in memory.store.list_kernels(task_id=task, target=target, limit=limit):
                _kernel_row(table, k)
            _console().print(table)
        if kind in ("all", "notes"):
            table = _note_table("notes")
            for n in memory.store.list_notes(task_id=task, limit=limit):
                _note_row(table, n)
            _console().print(table)


@app.command()
def search(
    query: Annotated[str, typer.Argument(help="free text (e.g. 'matmul gelu'), or a task id or folder")],
    k: Annotated[int, typer.Option("-k", "--k", min=1, help="how many results")] = 10,
    kind: Annotated[str, typer.Option(help="kernels, notes or all")] = "all",
) -> None:
    """Kernels and notes most similar to QUERY, best first, with their similarity score."""
    if kind not in ("all", "kernels", "notes"):
        _fail(f"--kind must be kernels, notes or all, not {kind!r}")
    with _memory() as memory:
        hits = memory.search(query, k=k, kind=cast(Kind, kind))
    kernels = _kernel_table(f"kernels like {query!r}")
    kernels.columns[-1].header = "score"
    notes = _note_table(f"notes like {query!r}")
    notes.columns[-1].header = "score"
    for hit in hits:
        if isinstance(hit, KernelHit):
            _kernel_row(kernels, hit.kernel, hit.score)
        elif isinstance(hit, NoteHit):
            _note_row(notes, hit.note, hit.score)
    if not hits:
        _console().print("nothing remembered yet")
    if kernels.row_count:
        _console().print(kernels)
    if notes.row_count:
        _console().print(notes)


@app.command()
def show(record_id: Annotated[str, typer.Argument(metavar="ID", help="an id or a unique prefix of one")]) -> None:
    """One kernel (with its code and report) or one note."""
    with _memory() as memory:
        record = memory.get(record_id)
    if isinstance(record, KernelRecord):
        table = Table(show_header=False, title=f"kernel {record.id}")
        report = record.report
        for name, value in (
            ("task", record.task_id),
            ("target", record.target),
            ("speedup", speedup_text(record.speedup, report.interval)),
            ("kernel / ref ms", f"{report.kernel_ms} / {report.ref_ms} ({report.basis or '-'})"),
            ("max abs err", str(report.max_abs_err)),
            ("strategy", record.strategy or "-"),
            ("produced by", record.produced_by or "-"),
            ("pattern", record.pattern or "-"),
            ("session", record.session_id or "-"),
            ("candidate / parent", f"{record.candidate_id} / {record.parent_id or '-'}"),
            ("created", record.created_at.isoformat()),
        ):
            table.add_row(name, value)
        _console().print(table)
        _console().out(record.code, highlight=False)  # raw, so that no line is cropped or wrapped for copying
    else:
        table = Table(show_header=False, title=f"note {record.id}")
        for name, value in (
            ("outcome", record.outcome),
            ("task", record.task_id or "-"),
            ("target", record.target or "-"),
            ("pattern", record.pattern or "-"),
            ("created", record.created_at.isoformat()),
        ):
            table.add_row(name, value)
        _console().print(table)
        _console().print(record.text)


@app.command("export")
def export_(file: Annotated[Path, typer.Argument(help="JSON-lines file to write")]) -> None:
    """Write every kernel and note to one JSON-lines file (to import on another machine)."""
    from memory.transfer import export_file

    with _memory() as memory:
        kernels, notes = export_file(memory, file)
    _console().print(f"exported {kernels} kernel(s) and {notes} note(s) to {file}")


@app.command("import")
def import_(file: Annotated[Path, typer.Argument(help="a file written by `memory export`")]) -> None:
    """Add the kernels and notes of an export file; ones already here are skipped."""
    from memory.transfer import import_file

    with _memory() as memory:
        summary = import_file(memory, file)
    _console().print(
        f"imported {summary.kernels_added} kernel(s) and {summary.notes_added} note(s) from {file} "
        f"(skipped {summary.kernels_skipped} kernel(s) and {summary.notes_skipped} note(s) already present)"
    )


@app.command()
def stats() -> None:
    """Where the memory lives and how much it holds."""
    with _memory() as memory:
        s = memory.stats()
    table = Table(show_header=False, title="memory")
    rows = [
        ("store", s.store.where),
        ("schema revision", s.store.schema_revision or "-"),
        ("vectors", s.vectors_where),
        ("embedding", s.embedding),
        ("kernels (vectors)", f"{s.store.kernels} ({s.kernel_vectors})"),
        ("notes (vectors)", f"{s.store.notes} ({s.note_vectors})"),
        ("tasks", str(s.store.tasks)),
        ("sessions", str(s.store.sessions)),
        ("candidates", str(s.store.candidates)),
        ("evaluations", str(s.store.evaluations)),
        ("events", str(s.store.events)),
        ("best speedup (by lower end)", speedup_text(s.store.best_speedup, s.store.best_speedup_ci)),
        ("kernels by target", ", ".join(f"{k}: {v}" for k, v in sorted(s.store.kernels_by_target.items())) or "-"),
        (
            "kernels by category",
            ", ".join(f"{k}: {v}" for k, v in sorted(s.store.kernels_by_category.items())) or "-",
        ),
    ]
    for name, value in rows:
        table.add_row(name, value)
    _console().print(table)


@app.command()
def reindex() -> None:
    """Rebuild the vector collections from the SQL records (after changing `embedding`)."""
    with _memory(for_reindex=True) as memory:
        kernels, notes = memory.reindex()
    _console().print(f"reindexed {kernels} kernel(s) and {notes} note(s)")


if __name__ == "__main__":
    app()
