"""The command line, run as a user runs it: a real subprocess."""

from __future__ import annotations

import pytest
import json
import os
import subprocess
import sys
from pathlib import Path

from support import EXAMPLES


def run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, JAX_PLATFORMS="cpu", COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "maxkernel.cli", *args], capture_output=True, text=True, timeout=timeout, env=env)


def test_tasks_lists_the_whole_suite():
    proc = run("tasks")
    assert proc.returncode == 0, proc.stderr
    for tid in ("1p_Flash_Attention", "12p_RMSNorm", "50k_Matmul_GELU_Softmax"):
        assert tid in proc.stdout


@pytest.mark.slow
def test_eval_prints_checks_writes_json_and_exits_zero_when_correct(tmp_path: Path):
    out = tmp_path / "report.json"
    proc = run("eval", "41k_Gemm_Add_ReLU", str(EXAMPLES / "gemm_add_relu_41k.py"), "--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "correct_inputs_shifted" in proc.stdout and "speedup" in proc.stdout
    report = json.loads(out.read_text())
    assert report["status"] == "ok" and report["correct"] and report["basis"] == "measured"
    low, high = report["speedup_ci"]  # the JSON carries the interval beside the speedup, and so does the table
    assert low <= report["speedup"] <= high
    assert f"{low:.2f}–{high:.2f}x" in proc.stdout or f"{low:.2f}" == f"{high:.2f}"  # equal ends print once
    assert {c["name"] for c in report["checks"]} >= {"static", "deterministic", "timed_what_was_checked"}


@pytest.mark.slow
def test_eval_exits_one_for_an_incorrect_candidate(tmp_path: Path):
    bad = tmp_path / "bad.py"
    bad.write_text("import jax.numpy as jnp\n\ndef kernel(x, weight, bias):\n    return jnp.zeros((x.shape[0], weight.shape[0]), x.dtype)\n")
    proc = run("eval", "41k_Gemm_Add_ReLU", str(bad))
    assert proc.returncode == 1
    assert "incorrect" in proc.stdout


def test_user_errors_are_one_line_and_exit_two(tmp_path: Path):
    for args, fragment in (
        (("eval", "no_such_task", str(EXAMPLES / "rmsnorm_12p.py")), "no_such_task: no such suite task"),
        (("eval", "12p_RMSNorm", str(tmp_path / "missing.py")), "missing.py: no such candidate file"),
        (("eval", "12p_RMSNorm", str(EXAMPLES / "rmsnorm_12p.py"), "--target", "tpu-v9"), "tpu-v9"),
    ):
        proc = run(*args)
        assert proc.returncode == 2, proc.stderr
        lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
        assert len(lines) == 1 and fragment in lines[0], proc.stderr


def test_broken_task_folder_is_named_in_the_error(tmp_path: Path):
    folder = tmp_path / "broken_task"
    folder.mkdir()
    (folder / "task.yaml").write_text("id: broken\nname: b\ncategory: matmul\n")
    (folder / "reference.py").write_text("def reference(x):\n    return x\n")
    proc = run("eval", str(folder), str(EXAMPLES / "rmsnorm_12p.py"))
    assert proc.returncode == 2
    assert "task.yaml" in proc.stderr and "description" in proc.stderr


def test_bench_one_task_with_json(tmp_path: Path):
    out = tmp_path / "bench.json"
    proc = run("bench", "12p_RMSNorm", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(out.read_text())
    assert rows[0]["task"] == "12p_RMSNorm" and rows[0]["ms"] > 0 and rows[0]["flops"] > 0
    assert "GFLOP/s" in proc.stdout


def test_a_task_whose_reference_breaks_is_reported_as_the_tasks_fault(tmp_path: Path):
    from jaxbench.task import load_task

    folder = tmp_path / "bad_reference"
    folder.mkdir()
    src = load_task("12p_RMSNorm").path
    (folder / "task.yaml").write_text((src / "task.yaml").read_text())
    (folder / "reference.py").write_text((src / "reference.py").read_text().replace("* weight", "@ weight[:3]"))
    proc = run("eval", str(folder), str(EXAMPLES / "rmsnorm_12p.py"))
    assert proc.returncode == 2
    assert "reference.py" in proc.stderr and "reference() fails" in proc.stderr


def test_memory_commands_are_reachable_from_the_main_cli(tmp_path: Path):
    env_dir = tmp_path / "data"
    proc = subprocess.run([sys.executable, "-m", "maxkernel.cli", "memory", "stats"], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu", COLUMNS="200", MAXKERNEL_DATA_DIR=str(env_dir)))
    assert proc.returncode == 0, proc.stderr
    assert "schema revision" in proc.stdout and (env_dir / "maxkernel.db").is_file()
