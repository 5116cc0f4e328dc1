"""The analyze and optimize commands: one clear error line on bad input, files written on success."""

from __future__ import annotations

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


def test_optimize_writes_the_kernel_and_the_report(tmp_path: Path) -> None:
    out, report = tmp_path / "kernels", tmp_path / "result.json"
    result = runner.invoke(app, ["optimize", "21k_Gemm_Divide_Sum_Scaling", "--budget", "20", "--out", str(out),
                                 "--json", str(report)])
    assert result.exit_code == 0, result.output
    kernel = out / "21k_Gemm_Divide_Sum_Scaling_cpu.py"
    assert "def kernel(" in kernel.read_text()
    data = json.loads(report.read_text())
    assert data["beat_reference"] and data["best_report"]["correct"]
