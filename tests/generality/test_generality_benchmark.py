"""benchmarks/generality.py: bad input is one line and exit 2; a run over a folder ends with a row per task
through the one engine; a run cut short resumes without running a finished task again; the peer's
starting programs become task folders without the trace being executed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "generality.py"
CALIBRATION = ROOT.parent / "shared" / "calibration" / "autocomp_v6e"

TASK = '''
import jax
import jax.numpy as jnp


def get_inputs(key, *, rows, cols):
    return (jax.random.normal(key, (rows, cols), jnp.float32),), {"scale": SCALE}


def reference(x, *, scale):
    return jax.nn.softmax(x * scale, axis=-1)
'''


def _folder(root: Path, name: str, scale: float) -> None:
    d = root / name
    d.mkdir(parents=True)
    (d / "reference.py").write_text(TASK.replace("SCALE", repr(scale)))
    (d / "task.yaml").write_text(f"id: {name}\nname: {name}\ncategory: reduction\ndescription: softmax\n"
                                 "dtype: float32\ntolerance: {atol: 1.0e-5, rtol: 1.0e-5}\n"
                                 "sizes:\n  cpu: {rows: 256, cols: 512}\n  full: {rows: 8192, cols: 4096}\n")


def _run(*args: str, data: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MAXKERNEL_DATA_DIR": str(data), "JAX_PLATFORMS": "cpu"}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=1500)


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    missing = _run("--tasks", str(tmp_path / "nowhere"), data=tmp_path)
    assert missing.returncode == 2 and "no such folder" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1
    not_a_run = _run("--resume", str(tmp_path), data=tmp_path)
    assert not_a_run.returncode == 2 and "not a generality run folder" in not_a_run.stderr


def test_summary_counts_winners_failures_and_template_errors() -> None:
    sys.path.insert(0, str(ROOT))
    from benchmarks.generality import summarize

    rows = [{"task": "a", "family": "f", "winner": "pallas", "speedup": 4.0, "status": "scored",
             "ref_roofline": 0.2, "winner_roofline": 0.8, "template_errors": []},
            {"task": "b", "family": "f", "winner": "reference", "speedup": 1.0, "status": "error",
             "template_errors": ["template:x: compile_error: y"]},
            {"task": "c", "family": "g", "winner": "jax", "speedup": 1.0, "status": "scored", "template_errors": []}]
    s = summarize(rows)
    assert s["families"]["f"]["pallas"] == 1 and s["families"]["f"]["failed"] == 1
    assert s["total"]["template_errors"] == 1 and s["total"]["jax"] == 1
    assert s["total"]["geomean"] == pytest.approx(4.0 ** (1 / 3))
    assert s["families"]["f"]["ref_roofline"] == pytest.approx(0.2)
    # a session whose planner raised scored the reference, having tried nothing: it counts as failed
    crashed = {"task": "d", "family": "g", "winner": "reference", "speedup": 1.0, "status": "scored",
               "stop_reason": "planner failed on OptimizeRequest: IndexError: tuple index out of range",
               "template_errors": []}
    assert summarize(rows + [crashed])["families"]["g"]["failed"] == 1


def test_the_fusion_targets_count_roofline_shares_with_and_without_the_dispatch_term() -> None:
    sys.path.insert(0, str(ROOT))
    from benchmarks.generality import device_roofline, fusion_targets

    # a: bound 0.1 ms, reference 0.5 ms (0.4 on device), a 2x winner at 0.25 ms (0.15 on device)
    # b: bound 0.9 ms, reference 1.0 ms (0.9 on device): already at its bound, returned
    # c: bound 0.3 ms, reference 0.5 ms (0.4 on device): below 70% with dispatch, 75% on device, returned
    rows = [{"task": "a", "winner": "pallas", "speedup": 2.0, "status": "scored", "bound_ms": 0.1,
             "ref_model_ms": 0.5, "ref_roofline": 0.2, "winner_roofline": 0.4},
            {"task": "b", "winner": "reference", "speedup": 1.0, "status": "scored", "bound_ms": 0.9,
             "ref_model_ms": 1.0, "ref_roofline": 0.9, "winner_roofline": 0.9},
            {"task": "c", "winner": "reference", "speedup": 1.0, "status": "scored", "bound_ms": 0.3,
             "ref_model_ms": 0.5, "ref_roofline": 0.6, "winner_roofline": 0.6}]
    assert device_roofline(rows[0], "ref", 0.1) == pytest.approx(0.25)
    assert device_roofline(rows[0], "winner", 0.1) == pytest.approx(0.1 / 0.15)
    assert device_roofline(rows[1], "winner", 0.1) == pytest.approx(1.0)
    lines = fusion_targets(rows, 0.1)
    assert lines[0].startswith("Pallas faster than the reference where the reference is below 70% of roofline: "
                               "1 of 2 (50%)")  # a won; c, at 60% with dispatch, was returned
    assert "where it is below 70% on device time: 1 of 1 (100%)" in lines[0]  # c is at 75% there
    assert lines[1].startswith("winner at 70% of roofline or more: 1 of 3 (33%)")
    assert "on device time (less the 0.1 ms dispatch term): 2 of 3 (67%)" in lines[1]  # a's 67% stays below
    assert "geometric mean 1.26x over 3 tasks" in lines[2] and "failed sessions: 0" in lines[2]


def test_variants_beside_their_originals_count_what_the_targets_ask() -> None:
    sys.path.insert(0, str(ROOT))
    from benchmarks.generality import against_originals

    originals = [{"task": "1p_A", "strategy": "template:flash", "speedup": 4.0, "winner_roofline": 0.5},
                 {"task": "2p_B", "strategy": "reference", "speedup": 1.0, "winner_roofline": 0.3}]
    variants = [
        {"task": "1p_A__permute", "strategy": "template:flash", "speedup": 3.8},  # kept, within 10%
        {"task": "1p_A__batch_added", "strategy": "rewrite:x+flash", "speedup": 2.0},  # another family
        {"task": "2p_B__statics", "strategy": "reference", "speedup": 1.0},  # kept: both return the reference
        {"task": "2p_B__dtype", "strategy": "template:y", "speedup": 1.5, "winner_roofline": 0.32},  # changes the work
        {"task": "3p_C__permute", "strategy": "template:z", "speedup": 2.0},  # no original on this model
    ]
    text = against_originals(variants, originals, "model-a", "model-a")
    assert "| 1p_A__permute | yes | flash 4.00x | flash 3.80x | yes | yes |" in text
    assert "| 1p_A__batch_added | yes | flash 4.00x | x+flash 2.00x | no | no |" in text
    assert ("the original's family on 2 of 3, within 10% of its speedup on 2. Changing the work: within 10% of the "
            "original's share of roofline on 1 of 1. Variants whose original is not in the run: 1.") in text


@pytest.mark.slow
def test_a_run_cut_short_resumes_without_rerunning_finished_tasks(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks"
    _folder(tasks, "soft_a", 1.5)
    _folder(tasks, "soft_b", 0.5)
    run = tmp_path / "run"
    first = _run("--tasks", str(tasks), "--evals", "2", "--run-dir", str(run), "--limit", "1", data=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    assert "1 tasks not run yet" in first.stdout
    rows = (run / "rows.jsonl").read_text().splitlines()
    assert len(rows) == 1
    again = _run("--resume", str(run), "--json", str(tmp_path / "out.json"), data=tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "1 done before, 1 to run now" in again.stdout
    lines = (run / "rows.jsonl").read_text().splitlines()
    assert lines[0] == rows[0] and len(lines) == 2
    result = json.loads((tmp_path / "out.json").read_text())
    assert sorted(r["task"] for r in result["rows"]) == ["soft_a", "soft_b"]
    for row in result["rows"]:
        assert row["status"] in ("scored", "budget", "failed", "error")
        assert row["winner"] in ("pallas", "jax", "reference")
        assert 0 < row["ref_roofline"] <= 1.0 and row["winner_roofline"] >= row["ref_roofline"] * 0.999
        assert row["commit"]  # each row names the code that ran it: a resumed run may span commits
    assert result["summary"]["total"]["tasks"] == 2
    assert result["config"]["cost_model"].startswith("model-")


@pytest.mark.slow
@pytest.mark.skipif(not CALIBRATION.is_dir(), reason="no ../shared/calibration beside the repository")
def test_peer_programs_become_task_folders_that_pass_task_check(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT))
    from benchmarks.peer_tasks import peer_task_folders
    from jaxbench.task import load_task
    from jaxbench.task_check import check_task

    folders = peer_task_folders(CALIBRATION, tmp_path)
    assert {f.name for f in folders} == {"peer_mamba2_ssd", "peer_retnet_retention"}
    for folder in folders:
        source = (folder / "reference.py").read_text()
        assert "CodeCandidate" not in source and "PRNGKey(42)" not in source
        from jaxbench.static_checks import scan

        assert scan(source)[0] == []  # the reference is judged as a candidate too: nothing it would be refused for
        task = load_task(folder)
        assert task.spec.sizes["full"]["seq_len"] == 2048
        result = check_task(task, timing=False)
        assert result.ok, result.problems


def test_a_run_told_to_stop_ends_its_sessions_processes_too(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import time

    root = ROOT
    script = (
        "import multiprocessing, os, signal, time\n"
        "from benchmarks import generality as g\n"
        "if __name__ == '__main__':\n"
        "    p = multiprocessing.get_context('spawn').Process(target=time.sleep, args=(120,))\n"
        "    p.start()\n"
        "    g.LIVE_SESSIONS.add(p)\n"
        "    signal.signal(signal.SIGTERM, g.stop_sessions)\n"
        "    print(p.pid, flush=True)\n"
        "    time.sleep(120)\n")
    (tmp_path / "run.py").write_text(script)
    proc = subprocess.Popen([sys.executable, str(tmp_path / "run.py")], cwd=root, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(root)})
    child = int(proc.stdout.readline())  # type: ignore[union-attr]
    proc.terminate()
    assert proc.wait(30) == 128 + 15
    for _ in range(50):  # killed, then reaped by init
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"session process {child} still running after its run stopped")
