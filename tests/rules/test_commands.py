"""The analyze and optimize commands: one clear error line on bad input, files written on success."""

from __future__ import annotations

import pytest
import json
from pathlib import Path

import typer
from typer.testing import CliRunner

from maxkernel.commands.analyze import analyze_command
from maxkernel.commands.optimize import optimize_command

app = typer.Typer()
app.command("analyze")(analyze_command)
app.command("optimize")(optimize_command)
runner = CliRunner()


def test_analyze_prints_the_op_graph() -> None:
    result = runner.invoke(app, ["analyze", "21k_Gemm_Divide_Sum_Scaling"])
    assert result.exit_code == 0, result.output
    assert "matmul_then_reduction" in result.output and "prologue [transpose]" in result.output


def test_bad_input_is_one_line_and_nonzero() -> None:
    for argv in (["analyze", "no_such_task"], ["optimize", "12p_RMSNorm", "--brain", "llm"],
                 ["optimize", "12p_RMSNorm", "--target", "tpu-v99"], ["optimize", "12p_RMSNorm", "--budget", "0"]):
        result = runner.invoke(app, argv)
        assert result.exit_code == 2, argv
        assert result.output.strip().startswith("error:") and len(result.output.strip().splitlines()) == 1, result.output


@pytest.mark.slow
def test_optimize_on_a_folder_is_a_session_in_the_log_memory_report_and_search(tmp_path: Path) -> None:
    """A new user's path: optimize a task folder, then memory stats, the session's report, a search."""
    import shutil

    from jaxbench.task import load_task
    from maxkernel.cli import app as main_app

    folder = tmp_path / "my_gemm"
    shutil.copytree(load_task("21k_Gemm_Divide_Sum_Scaling").path, folder)
    out, report = tmp_path / "kernels", tmp_path / "result.json"
    result = runner.invoke(main_app, ["optimize", str(folder), "--budget", "20", "--out", str(out), "--json", str(report)])
    assert result.exit_code == 0, result.output
    assert "kernel written to" in result.output and "baseline" in result.output
    kernel = out / "21k_Gemm_Divide_Sum_Scaling_cpu.py"
    assert "def kernel(" in kernel.read_text()
    data = json.loads(report.read_text())
    for key in ("session_id", "evaluations", "first_correct_at", "best_at", "speedup", "confirmed_speedup"):
        assert key in data, key
    assert data["beat_reference"] and data["best_report"]["correct"] and data["best_strategy"].startswith("rewrite:")
    assert data["confirmed_speedup"] >= data["bar"] >= 1.0 and 1 <= data["best_at"] <= data["evaluations"]
    low, high = data["speedup_ci"]  # the interval beside the figure, and "faster" only when it clears the bar
    assert 1.0 < low <= data["confirmed_speedup"] <= high and data["claim"] == "faster"
    said = " ".join(result.output.split())  # the verdict line may wrap at the terminal's width
    assert data["best_report"]["speedup_ci"] == [low, high] and "faster than the reference" in said
    roles = [t["role"] for t in data["trials"]]
    assert roles[0] == "baseline" and "confirm" in roles and len(roles) == data["evaluations"]

    stats = runner.invoke(main_app, ["memory", "stats"])
    assert stats.exit_code == 0, stats.output
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in stats.output.splitlines()
            if line.count("│") >= 3}
    assert rows["sessions"] == "1" and int(rows["events"]) > 0 and rows["kernels by target"] == "cpu: 1"

    html = tmp_path / "session.html"
    shown = runner.invoke(main_app, ["report", data["session_id"], "--out", str(html)])
    assert shown.exit_code == 0, shown.output
    assert data["session_id"][:12] in html.read_text() and "rewrite:sum_after_matmul" in html.read_text()

    searched = runner.invoke(main_app, ["search", str(folder), "--evals", "2", "--algo", "parallel"])
    assert searched.exit_code == 0, searched.output
    assert "apply recall:" in searched.output and "confirmed" in searched.output  # it starts from the kernel
