"""Export and import: memories move between machines in one JSON-lines file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jaxbench import load_task
from maxkernel.config import Settings
from memory import Memory
from memory.errors import TransferFileError
from memory.transfer import export_file, import_file

NAMES = ("t_gemm_relu", "t_gemm_tanh_scale", "t_rmsnorm")


@pytest.fixture
def source(tmp_path: Path, task_dir, make_report, make_code):
    """The machine the memories come from."""
    with Memory.open(Settings(data_dir=str(tmp_path / "machine-a"))) as memory:
        for i, name in enumerate(NAMES):
            memory.remember_kernel(
                make_report(name, speedup=2.0 + i), make_code(name), task=load_task(task_dir(name)),
                strategy="fused epilogue", produced_by="coder/rules", session_id="s1", parent_id=f"p{i}",
            )  # fmt: skip
        memory.remember_note("fuse the epilogue", task=load_task(task_dir("t_gemm_relu")), outcome="worked", target="cpu")
        memory.remember_note("a general lesson", outcome="info")
        yield memory


def _other(tmp_path: Path, name: str = "machine-b") -> Settings:
    return Settings(data_dir=str(tmp_path / name))


def test_export_then_import_on_another_machine(source: Memory, settings: Settings, tmp_path: Path) -> None:
    path = tmp_path / "memories.jsonl"
    assert export_file(source, path) == (3, 2)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["kind"] for line in lines] == ["header", "kernel", "kernel", "kernel", "note", "note"]

    with Memory.open(settings) as target:  # a fresh memory: SQLite+embedded, and PostgreSQL+server
        summary = import_file(target, path)
        assert (summary.kernels_added, summary.notes_added, summary.kernels_skipped) == (3, 2, 0)
        originals = {k.id: k for k in source.store.list_kernels()}
        imported = {k.id: k for k in target.store.list_kernels()}
        assert imported.keys() == originals.keys()
        for kid, kernel in imported.items():
            expected = originals[kid]
            assert (kernel.code, kernel.report, kernel.strategy, kernel.produced_by) == (
                expected.code, expected.report, expected.strategy, expected.produced_by,
            )  # fmt: skip
            assert (kernel.parent_id, kernel.session_id, kernel.created_at) == (
                expected.parent_id, expected.session_id, expected.created_at,
            )  # fmt: skip
        assert {n.text for n in target.store.list_notes()} == {"fuse the epilogue", "a general lesson"}
        # the task folders are not on this machine: recall works from the imported signatures
        [best] = target.recall_kernels("t_rmsnorm", k=1)
        assert best.kernel.task_id == "t_rmsnorm" and best.score > 0.8
        assert target.recall_notes("t_gemm_relu", k=1)[0].note.text == "fuse the epilogue"

        again = import_file(target, path)
        assert (again.kernels_added, again.kernels_skipped, again.notes_added, again.notes_skipped) == (0, 3, 0, 2)
        stats = target.stats()
        assert (stats.store.kernels, stats.kernel_vectors, stats.store.notes, stats.note_vectors) == (3, 3, 2, 2)


def _exported(source: Memory, tmp_path: Path) -> list[str]:
    path = tmp_path / "good.jsonl"
    export_file(source, path)
    return path.read_text().splitlines()


def _import_fails(tmp_path: Path, lines: list[str], match: str) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    with Memory.open(_other(tmp_path)) as target:
        with pytest.raises(TransferFileError, match=match) as info:
            import_file(target, bad)
        assert "\n" not in str(info.value)
        stats = target.store.stats()
        assert (stats.kernels, stats.notes, stats.tasks) == (0, 0, 0)  # nothing half-imported


def test_a_malformed_line_names_its_number_and_imports_nothing(source: Memory, tmp_path: Path) -> None:
    lines = _exported(source, tmp_path)
    _import_fails(tmp_path, lines[:3] + ["{not json"] + lines[3:], r"bad.jsonl:4: not valid JSON")
    broken = json.loads(lines[2])
    del broken["code"]
    _import_fails(tmp_path, lines[:2] + [json.dumps(broken)] + lines[3:], r"bad.jsonl:3: kernel.code: Field required")


def test_an_unverified_kernel_in_a_file_is_refused(source: Memory, tmp_path: Path) -> None:
    lines = _exported(source, tmp_path)
    forged = json.loads(lines[1])
    forged["report"]["correct"] = False
    _import_fails(tmp_path, [lines[0], json.dumps(forged)] + lines[2:], r"bad.jsonl:2: kernel .* did not pass")


def test_not_an_export_or_a_newer_format(source: Memory, tmp_path: Path) -> None:
    lines = _exported(source, tmp_path)
    _import_fails(tmp_path, lines[1:], r"bad.jsonl:1: not a MaxKernel memory export")
    header = json.loads(lines[0])
    header["version"] = 99
    _import_fails(tmp_path, [json.dumps(header)] + lines[1:], r"version 99 is newer")
    with Memory.open(_other(tmp_path)) as target, pytest.raises(TransferFileError, match="cannot read"):
        import_file(target, tmp_path / "missing.jsonl")


def test_an_export_that_cannot_be_written_leaves_no_file(source: Memory, tmp_path: Path) -> None:
    with pytest.raises(TransferFileError, match="cannot write the export file"):
        export_file(source, tmp_path / "no-such-dir" / "out.jsonl")
    assert not (tmp_path / "no-such-dir").exists()
