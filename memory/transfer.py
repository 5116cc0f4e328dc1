"""Moving memories between machines: one JSON-lines file of kernels and notes.

The first line is a header; every other line is one self-contained kernel (with its task's
signature, code and full report) or note. Import reads and validates the whole file before writing
anything, keeps ids (so importing the same file twice adds nothing), re-embeds with the local
embedding, and refuses kernels whose report did not pass, exactly as ``remember_kernel`` does.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Annotated, Literal

from pydantic import BaseModel, Field, TypeAdapter, ValidationError

from jaxbench.report import EvalReport
from maxkernel.analysis.signature import TaskSignature
from memory.errors import TransferFileError, one_line
from memory.facade import Memory
from memory.models import KernelRecord, NewKernel, NoteRecord, Outcome

FORMAT = "maxkernel-memory"
VERSION = 1


class Header(BaseModel):
    kind: Literal["header"] = "header"
    format: Literal["maxkernel-memory"] = FORMAT
    version: int = VERSION
    exported_at: datetime
    source: str
    embedding: str


class TaskPart(BaseModel):
    id: str
    name: str = ""
    category: str | None = None
    source_digest: str = ""
    signature: TaskSignature | None = None


class KernelLine(BaseModel):
    kind: Literal["kernel"] = "kernel"
    id: str
    task: TaskPart
    strategy: str = ""
    produced_by: str = ""
    candidate_id: str
    session_id: str | None = None
    parent_id: str | None = None
    code: str
    report: EvalReport
    created_at: datetime


class NoteLine(BaseModel):
    kind: Literal["note"] = "note"
    id: str
    task: TaskPart | None = None
    text: str
    outcome: Outcome
    pattern: str = ""
    target: str | None = None
    category: str | None = None
    session_id: str | None = None
    created_at: datetime


Line = Annotated[KernelLine | NoteLine, Field(discriminator="kind")]
_LINE = TypeAdapter(Line)


class ImportSummary(BaseModel):
    kernels_added: int = 0
    kernels_skipped: int = 0
    notes_added: int = 0
    notes_skipped: int = 0


def _task_part(memory: Memory, task_id: str | None, cache: dict[str, TaskPart]) -> TaskPart | None:
    if not task_id:
        return None
    if task_id not in cache:
        info = memory.store.get_task(task_id)
        cache[task_id] = TaskPart.model_validate(info.model_dump()) if info else TaskPart(id=task_id)
    return cache[task_id]


def _kernel_line(k: KernelRecord, task: TaskPart) -> KernelLine:
    return KernelLine(
        id=k.id,
        task=task,
        strategy=k.strategy,
        produced_by=k.produced_by,
        candidate_id=k.candidate_id,
        session_id=k.session_id,
        parent_id=k.parent_id,
        code=k.code,
        report=k.report,
        created_at=k.created_at,
    )


def _note_line(n: NoteRecord, task: TaskPart | None) -> NoteLine:
    return NoteLine(task=task, **n.model_dump(exclude={"task_id"}))


def export_memory(memory: Memory, out: IO[str]) -> tuple[int, int]:
    """Write every kernel and note to ``out``; returns (kernels, notes) written."""
    header = Header(exported_at=datetime.now(UTC), source=memory.store.where, embedding=memory.embedder.name)
    out.write(header.model_dump_json() + "\n")
    tasks: dict[str, TaskPart] = {}
    kernels = notes = 0
    for batch in memory.store.iter_kernels():
        for k in batch:
            out.write(_kernel_line(k, _task_part(memory, k.task_id, tasks) or TaskPart(id=k.task_id)).model_dump_json())
            out.write("\n")
            kernels += 1
    for batch in memory.store.iter_notes():
        for n in batch:
            out.write(_note_line(n, _task_part(memory, n.task_id, tasks)).model_dump_json() + "\n")
            notes += 1
    return kernels, notes


def export_file(memory: Memory, path: Path) -> tuple[int, int]:
    """Export to ``path``, written beside it first and renamed, so a failure leaves no half file."""
    partial = path.with_name(path.name + ".partial")
    try:
        with partial.open("w", encoding="utf-8") as out:
            counts = export_memory(memory, out)
        partial.replace(path)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise TransferFileError(f"cannot write the export file {path}: {exc.strerror or exc}") from exc
    return counts


def _read_lines(path: Path) -> Iterator[tuple[int, str]]:
    try:
        with path.open(encoding="utf-8") as handle:
            for number, text in enumerate(handle, start=1):
                if text.strip():
                    yield number, text
    except OSError as exc:
        raise TransferFileError(f"cannot read the import file {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise TransferFileError(f"{path}: not a UTF-8 text file ({exc.reason})") from exc


def _first_error(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    return f"{where}: {first['msg']}" if where else first["msg"]


def parse_file(path: Path) -> tuple[Header, list[KernelLine], list[NoteLine]]:
    """Read and validate every line; the first problem ends in ``TransferFileError`` naming its line."""
    header: Header | None = None
    kernels: list[KernelLine] = []
    notes: list[NoteLine] = []
    for number, text in _read_lines(path):
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TransferFileError(f"{path}:{number}: not valid JSON ({exc.msg})") from exc
        if header is None:
            if not isinstance(raw, dict) or raw.get("format") != FORMAT:
                raise TransferFileError(f"{path}:{number}: not a MaxKernel memory export (no {FORMAT!r} header)")
            if isinstance(raw.get("version"), int) and raw["version"] > VERSION:
                raise TransferFileError(
                    f"{path}:{number}: export format version {raw['version']} is newer than this "
                    f"MaxKernel's {VERSION}; upgrade MaxKernel to import it"
                )
            try:
                header = Header.model_validate(raw)
            except ValidationError as exc:
                raise TransferFileError(f"{path}:{number}: bad header: {one_line(_first_error(exc))}") from exc
            continue
        try:
            line = _LINE.validate_python(raw)
        except ValidationError as exc:
            raise TransferFileError(f"{path}:{number}: {one_line(_first_error(exc))}") from exc
        if isinstance(line, KernelLine):
            if not line.report.passed:
                raise TransferFileError(
                    f"{path}:{number}: kernel {line.id} has a report that did not pass "
                    f"(status={line.report.status}, correct={line.report.correct}); refusing the file"
                )
            kernels.append(line)
        else:
            notes.append(line)
    if header is None:
        raise TransferFileError(f"{path}: empty file, not a MaxKernel memory export")
    return header, kernels, notes


def import_file(memory: Memory, path: Path) -> ImportSummary:
    """Import an export file into ``memory``; records already present (same id) are skipped."""
    _, kernel_lines, note_lines = parse_file(path)
    summary = ImportSummary()
    tasks = {line.task.id: line.task for line in kernel_lines}
    tasks.update({line.task.id: line.task for line in note_lines if line.task is not None})
    for task in tasks.values():
        memory.store.ensure_task(
            task.id,
            name=task.name,
            category=task.category,
            source_digest=task.source_digest,
            signature=task.signature,
            overwrite=False,
        )
    if kernel_lines:
        signatures = {t.id: t.signature for t in tasks.values()}
        entries = [
            NewKernel(
                id=line.id,
                task_id=line.task.id,
                code=line.code,
                report=line.report,
                strategy=line.strategy,
                produced_by=line.produced_by,
                session_id=line.session_id,
                candidate_id=line.candidate_id,
                parent_id=line.parent_id,
                created_at=line.created_at,
            )
            for line in kernel_lines
        ]
        results: list[tuple[str, bool]] = []
        for start in range(0, len(entries), 1000):
            chunk = entries[start : start + 1000]
            results += memory.store_kernels(
                chunk,
                tasks=[
                    signatures.get(e.task_id) or TaskSignature(task_id=e.task_id, category=tasks[e.task_id].category)
                    for e in chunk
                ],
            )
        summary.kernels_added = sum(1 for _, new in results if new)
        summary.kernels_skipped = len(results) - summary.kernels_added
    if note_lines:
        present = set(memory.store.notes([line.id for line in note_lines]))
        for line in note_lines:
            if line.id in present:
                summary.notes_skipped += 1
                continue
            memory.import_note(
                NoteRecord(task_id=line.task.id if line.task else None, **line.model_dump(exclude={"kind", "task"}))
            )
            summary.notes_added += 1
    return summary
