"""``maxkernel memory`` (run here as the typer app, and once as ``python -m memory.cli``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from jaxbench import load_task
from maxkernel.config import load_settings
from memory import Memory
from memory.cli import app

runner = CliRunner()


@pytest.fixture(autouse=True)
def _wide_terminal(monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")


@pytest.fixture
def filled(task_dir, make_report, make_code) -> dict[str, str]:
    """A memory in MAXKERNEL_DATA_DIR (set per test by conftest) with two kernels and a note."""
    with Memory.open(load_settings()) as memory:
        relu = memory.remember_kernel(
            make_report("t_gemm_relu", speedup=2.5), make_code("relu"), task=load_task(task_dir("t_gemm_relu")),
            strategy="fused bias+relu epilogue",
        )  # fmt: skip
        norm = memory.remember_kernel(
            make_report("t_rmsnorm", target="tpu-v5e"), make_code("norm"), task=load_task(task_dir("t_rmsnorm"))
        )
        note = memory.remember_note("keep the whole row in VMEM", task=load_task(task_dir("t_rmsnorm")), outcome="worked")
    return {"relu": relu.id, "norm": norm.id, "note": note.id}


def _ok(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.stdout


def _fails(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_list_shows_kernels_and_notes(filled: dict[str, str]) -> None:
    out = _ok("list")
    assert filled["relu"][:12] in out and filled["norm"][:12] in out and filled["note"][:12] in out
    assert "t_gemm_relu" in out and "2.50x" in out and "keep the whole row" in out
    only_tpu = _ok("list", "--kind", "kernels", "--target", "tpu-v5e")
    assert filled["norm"][:12] in only_tpu and filled["relu"][:12] not in only_tpu and "notes" not in only_tpu


def test_search_ranks_by_similarity(filled: dict[str, str]) -> None:
    out = _ok("search", "matmul relu epilogue", "-k", "2", "--kind", "kernels")
    assert out.index("t_gemm_relu") < out.index("t_rmsnorm") and "score" in out


def test_show_a_kernel_and_a_note_by_id_prefix(filled: dict[str, str]) -> None:
    out = _ok("show", filled["relu"][:8])
    assert filled["relu"] in out and "fused bias+relu epilogue" in out and "pl.pallas_call" in out
    out = _ok("show", filled["note"])
    assert "keep the whole row in VMEM" in out and "worked" in out


def test_stats(filled: dict[str, str]) -> None:
    out = _ok("stats")
    assert "structural-v1-256" in out and "cpu: 1, tpu-v5e: 1" in out and "2 (2)" in out


def test_export_import_round_trip(filled: dict[str, str], tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "out.jsonl"
    assert "exported 2 kernel(s) and 1 note(s)" in _ok("export", str(path))
    monkeypatch.setenv("MAXKERNEL_DATA_DIR", str(tmp_path / "elsewhere"))
    assert "imported 2 kernel(s) and 1 note(s)" in _ok("import", str(path))
    assert "skipped 2 kernel(s) and 1 note(s)" in _ok("import", str(path))
    assert filled["relu"] in _ok("show", filled["relu"])


def test_user_errors_end_in_one_line(filled: dict[str, str], tmp_path: Path) -> None:
    assert "no kernel or note with id 'ffffffff'" in _fails("show", "ffffffff")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"kind": "kernel"}\n')
    assert "bad.jsonl:1: not a MaxKernel memory export" in _fails("import", str(bad))
    assert "cannot read the import file" in _fails("import", str(tmp_path / "missing.jsonl"))
    assert "--kind must be" in _fails("list", "--kind", "everything")


def test_bad_settings_end_in_one_line(monkeypatch) -> None:
    monkeypatch.setenv("MAXKERNEL_EMBEDDING", "word2vec")
    assert "unknown embedding 'word2vec'" in _fails("stats")
    monkeypatch.setenv("MAXKERNEL_EMBEDDING", "structural")
    monkeypatch.setenv("MAXKERNEL_EVAL_WORKERS", "many")
    assert "MAXKERNEL_EVAL_WORKERS='many'" in _fails("stats")


@pytest.mark.slow
def test_runs_as_a_module(filled: dict[str, str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "memory", "list", "--kind", "notes"], capture_output=True, text=True, env=dict(os.environ)
    )
    assert result.returncode == 0, result.stderr
    assert filled["note"][:12] in result.stdout


def test_a_narrow_terminal_never_cuts_ids_or_code(filled: dict[str, str], monkeypatch) -> None:
    """What a user copies (an id from the list, a line of code from show) comes out whole at 60 columns."""
    from memory import Store

    monkeypatch.setenv("COLUMNS", "60")
    listed = _ok("list")
    assert all(filled[k][:12] in listed for k in ("relu", "norm", "note"))
    with Store.open(load_settings().resolved_store_url) as store:
        code = store.kernels([filled["relu"]])[filled["relu"]].code
    shown = _ok("show", filled["relu"][:6]).splitlines()
    assert max(map(len, code.splitlines())) > 60  # a line wider than the terminal
    assert all(line in shown for line in code.splitlines() if line.strip())


def test_memory_shows_intervals_and_ranks_its_best_by_the_lower_end(task_dir, make_report, make_code) -> None:
    task = load_task(task_dir("t_gemm_relu"))
    lucky = make_report("t_gemm_relu", speedup=2.5).model_copy(update={"speedup_ci": (0.9, 3.8)})
    steady = make_report("t_gemm_relu", speedup=1.6).model_copy(update={"speedup_ci": (1.52, 1.68)})
    with Memory.open(load_settings()) as memory:
        memory.remember_kernel(lucky, make_code("lucky"), task=task, strategy="noisy")
        kept = memory.remember_kernel(steady, make_code("steady"), task=task, strategy="steady")
        stats = memory.stats().store
    assert (stats.best_speedup, stats.best_speedup_ci) == (1.6, (1.52, 1.68))  # not the lucky 2.5x
    assert "1.60x (1.52–1.68x)" in _ok("stats")
    listed = _ok("list", "--kind", "kernels")
    assert "2.50x (0.90–3.80x)" in listed and "1.60x (1.52–1.68x)" in listed
    assert "1.60x (1.52–1.68x)" in _ok("show", kept.id)
