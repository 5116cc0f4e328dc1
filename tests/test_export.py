"""``maxkernel export``: a short optimization's winner leaves as a package that imports and passes its own
test in a fresh virtual environment, without MaxKernel or JaxBench."""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

import pytest

TASK = "21k_Gemm_Divide_Sum_Scaling"  # its sum-after-matmul rewrite wins within seconds


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    from maxkernel.cli import app

    with pytest.raises(SystemExit) as info:
        app(args=list(args), prog_name="maxkernel")
    out = capsys.readouterr()
    return int(info.value.code or 0), out.out, out.err


def _fresh_python(where: Path) -> Path:
    """A new venv that sees the system's JAX (and nothing of this checkout on its path)."""
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(where)
    return where / "bin" / "python"


@pytest.mark.slow
def test_an_exported_kernel_passes_its_own_test_in_a_fresh_venv(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import maxkernel

    monkeypatch.setenv("JAXBENCH_UNSEEN_SIZE", "1")  # the session's evaluator checks an unseen size too
    result = maxkernel.optimize(TASK, target="cpu", budget_s=60, evals=3, brain="rules")
    assert result.beat_reference and result.best_strategy.startswith("rewrite:"), result.verdict

    code, out, err = _cli(capsys, "export", TASK, "--out", str(tmp_path / "out"))
    assert code == 0, err
    package = tmp_path / "out" / "gemm_divide_sum_scaling"
    module = (package / "gemm_divide_sum_scaling.py").read_text()
    assert "def gemm_divide_sum_scaling(x, weight, *, scaling_factor):" in module  # the reference's signature
    assert "Bias-free matmul x @ W^T" in module  # and its docstring
    assert "TUNED = {" in module and "('cpu', 'any')" in module  # the tuned table of its strategy
    assert "free sizes batch" in module and "passed the evaluator at unseen size batch=" in module
    assert "Dtypes: float32. Chips: cpu. Forward only" in module and "21k_Gemm_Divide_Sum_Scaling" in out

    python = _fresh_python(tmp_path / "venv")
    script = ("import sys, importlib; t = importlib.import_module('gemm_divide_sum_scaling.test_gemm_divide_sum_scaling');"
              " t.test_gemm_divide_sum_scaling();"
              " leaked = sorted(m for m in sys.modules if m.split('.')[0] in ('maxkernel', 'jaxbench', 'memory'));"
              " assert not leaked, leaked; print('exported test passed')")
    env = {"PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu", "HOME": str(tmp_path)}
    ran = subprocess.run([str(python), "-c", script], cwd=tmp_path / "out", env=env, capture_output=True, text=True,
                         timeout=300)
    assert ran.returncode == 0 and "exported test passed" in ran.stdout, ran.stderr[-2000:]

    # The shipped test is a real check: the same kernel off by a little fails it.
    call = "    return _computation(x, weight, scaling_factor=static['scaling_factor'])"  # the static passed on
    wrong = module.replace(call, call + " * 1.001")
    assert wrong != module
    (package / "gemm_divide_sum_scaling.py").write_text(wrong)
    ran = subprocess.run([str(python), "-m", "gemm_divide_sum_scaling.test_gemm_divide_sum_scaling"],
                         cwd=tmp_path / "out", env=env, capture_output=True, text=True, timeout=300)
    assert ran.returncode != 0 and "Not equal to tolerance" in ran.stderr

    # Several subjects (here the task and the session that made its kernel) make one package.
    code, _, err = _cli(capsys, "export", TASK, result.session_id[:12], "--out", str(tmp_path / "two"), "--name", "mine")
    assert code == 0, err
    init = (tmp_path / "two" / "mine" / "__init__.py").read_text()
    assert "from .gemm_divide_sum_scaling import gemm_divide_sum_scaling" in init
    assert "from .gemm_divide_sum_scaling_2 import gemm_divide_sum_scaling_2" in init


def test_export_of_a_task_memory_has_no_kernel_of_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = _cli(capsys, "export", "12p_RMSNorm", "--out", str(tmp_path))
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "no verified kernel" in lines[0] and "maxkernel optimize 12p_RMSNorm" in lines[0]
    code, _, err = _cli(capsys, "export", "zzzz9999", "--out", str(tmp_path))
    assert code == 2 and "not a task" in err


def test_an_exported_pallas_kernel_runs_interpreted_on_a_cpu(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                             quick_evaluator: object) -> None:
    """A Pallas kernel (the fused-tail template on 41k) leaves with its test; on a CPU it runs interpreted."""
    from jaxbench.task import load_task
    from maxkernel.templates import FUSED_TAIL
    from memory import Memory

    task = load_task("41k_Gemm_Add_ReLU")
    source = FUSED_TAIL.render(task, {}, ("cpu",))
    report = quick_evaluator.evaluate(task, source)  # type: ignore[attr-defined]
    assert report.passed and report.label == "pallas-kernel" and report.check("correct_unseen_size").passed
    with Memory.open() as memory:
        memory.remember_kernel(report, source, strategy="template:fused_tail")
    code, out, err = _cli(capsys, "export", task.id, "--out", str(tmp_path))
    assert code == 0, err
    module = (tmp_path / "gemm_add_relu" / "gemm_add_relu.py").read_text()
    assert "def gemm_add_relu(x, weight, bias):" in module and "force_tpu_interpret_mode" in module
    assert "passed the evaluator at unseen size" in module
    ran = subprocess.run([sys.executable, "-m", "gemm_add_relu.test_gemm_add_relu"], cwd=tmp_path,
                         env={"PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu", "HOME": str(tmp_path)},
                         capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0 and "matches the reference at 3 sizes" in ran.stdout, ran.stderr[-2000:]


def test_export_names_a_corrupt_store_in_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "corrupt"
    data.mkdir()
    (data / "maxkernel.db").write_bytes(b"not a database" * 300)
    monkeypatch.setenv("MAXKERNEL_DATA_DIR", str(data))
    code, _, err = _cli(capsys, "export", TASK, "--out", str(tmp_path / "out"))
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "corrupt" in lines[0] and str(data / "maxkernel.db") in lines[0]
    assert not (tmp_path / "out").exists()


def test_the_unseen_size_check_is_on_unless_the_environment_says_no(monkeypatch: pytest.MonkeyPatch) -> None:
    """What an export says of unseen sizes comes from this check; JAXBENCH_UNSEEN_SIZE=0 turns it off."""
    from jaxbench.evaluate import EvalConfig, EvalSettingError

    monkeypatch.delenv("JAXBENCH_UNSEEN_SIZE", raising=False)
    assert EvalConfig().unseen_size is True and EvalConfig(unseen_size=False).unseen_size is False
    monkeypatch.setenv("JAXBENCH_UNSEEN_SIZE", "0")
    assert EvalConfig().unseen_size is False and EvalConfig(unseen_size=True).unseen_size is True
    monkeypatch.setenv("JAXBENCH_UNSEEN_SIZE", "maybe")
    with pytest.raises(EvalSettingError, match="JAXBENCH_UNSEEN_SIZE='maybe': expected 1 or 0"):
        EvalConfig()
