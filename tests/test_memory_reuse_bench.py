"""The bookkeeping of benchmarks/memory_reuse.py: which tasks are measured warm, how a run's noise is told,
and what the ratio counts."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import ModuleType

import pytest

from support import load_benchmark

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "memory_reuse.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_benchmark("memory_reuse")


def run(bench: ModuleType, task: str, readings: list[float | None], confirmed: float | None,
        is_reference: bool = False, confirm_runs: list[float] | None = None, shas: list[str] | None = None,
        best_sha: str = ""):
    shas = shas or [f"k{i}" for i in range(len(readings))]
    steps = [bench.Step(n=i + 1, seconds=float(i), passed=r is not None, speedup=r, sha=h)
             for i, (r, h) in enumerate(zip(readings, shas))]
    return bench.Run(task=task, session_id="s", evaluations=len(steps), seconds=float(len(steps)), steps=steps,
                     best_strategy="x", best_sha=best_sha, is_reference=is_reference, confirmed=confirmed,
                     confirm_runs=confirm_runs or [])


ARGS = argparse.Namespace(tolerance=0.05, budget=6, min_cold_evals=3)


def test_only_tasks_whose_cold_best_came_late_are_measured_warm(bench: ModuleType) -> None:
    cold = {"early": run(bench, "early", [2.0, 1.1, 1.2], 2.0),               # best at evaluation 1
            "late": run(bench, "late", [1.1, None, 1.2, 1.9], 2.0),            # 1.9 is within 5% of 2.0: at 4
            "never": run(bench, "never", [1.1, 1.2], 2.0),                     # confirmed above every reading
            "third": run(bench, "third", [1.0, 1.1, 1.5], 1.5),                # exactly at the threshold
            "reference": run(bench, "reference", [0.9, 0.8, 0.7, 0.95], 0.95, is_reference=True)}
    measured, dropped = bench.select_late(cold, list(cold), ARGS)
    assert measured == ["late", "never", "third"]
    assert dropped == ["early", "reference"]
    assert cold["never"].reach_at(bench.goal_of(cold["never"], 0.05), ARGS.budget + 1) == 7  # budget + 1


def test_the_cold_figures_stand_on_their_own(bench: ModuleType) -> None:
    """What is written once the cold phase ends, before any warm run: a run cut off later keeps it."""
    cold = {"early": run(bench, "early", [2.0, 1.1], 2.0), "late": run(bench, "late", [1.1, None, 1.9], 2.0)}
    report = bench.cold_report(cold, ["late"], ARGS)
    assert report["cold"]["early"]["reach"] == 1 and report["cold"]["late"]["reach"] == 3
    assert not report["cold"]["early"]["measured_warm"] and report["cold"]["late"]["measured_warm"]
    assert report["args"]["budget"] == "6"


def test_ratio_counts_evaluations_to_the_cold_best_and_states_the_noise(bench: ModuleType) -> None:
    cold = run(bench, "t", [1.1, 1.2, 1.3, 2.0], 2.0, confirm_runs=[1.9, 2.0, 2.2])
    warm = run(bench, "t", [1.95, 1.0], 2.1, confirm_runs=[2.0, 2.1, 2.1])
    missed = run(bench, "t", [1.2, 1.3], 1.3, confirm_runs=[1.3, 1.3])
    rows = [bench.row(cold, warm, ARGS), bench.row(cold, missed, ARGS)]
    assert [r["warm_evals_counted"] for r in rows] == [1, 7] and rows[0]["cold_evals_counted"] == 4
    summary = bench.summarize(rows)
    assert summary["ratio"] == pytest.approx((1 + 7) / (4 + 4), abs=1e-3)
    assert rows[0]["cold_noise"] == pytest.approx(0.15) and rows[1]["warm_noise"] == 0.0
    assert summary["noise_max"] == pytest.approx(0.15)
    assert summary["warm_at_least_cold"] == "1/2"
    # missed's best (1.3) lies below cold's lowest reading (1.9): not within the noise either
    assert summary["warm_at_least_cold_within_noise"] == "1/2"
    lower = run(bench, "t", [1.8], 1.8, confirm_runs=[1.7, 1.8, 1.95])  # below 2.0 * 0.95, but reaches 1.9
    assert not bench.row(cold, lower, ARGS)["warm_at_least_cold"]
    assert bench.row(cold, lower, ARGS)["warm_at_least_cold_within_noise"]
    assert bench.spread([1.0]) is None  # one reading tells no spread


def test_a_tpu_run_is_confirmed_once_and_a_bad_target_is_one_line(bench: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess
    from types import SimpleNamespace

    import maxkernel.evaluation as evaluation

    calls: list[str] = []

    def judged(task: object, source: str, target: str, *rest: object) -> SimpleNamespace:
        calls.append(target)
        return SimpleNamespace(passed=True, speedup=2.5)

    monkeypatch.setattr(evaluation, "evaluate_candidate", judged)
    services = SimpleNamespace(task=lambda t: t, evaluator=None)
    assert bench.confirm(services, "t", SimpleNamespace(best_source="x", target="tpu-v6e"), 3) == [2.5]
    assert bench.confirm(services, "t", SimpleNamespace(best_source="x", target="cpu"), 3) == [2.5] * 3
    assert calls == ["tpu-v6e"] + ["cpu"] * 3

    done = subprocess.run([sys.executable, str(BENCH), "--target", "tpu-v9", "--measure", "12p_RMSNorm"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.strip().startswith("error: --target: unknown target 'tpu-v9'")
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_run_reaches_the_cold_best_where_it_measures_the_cold_winner(bench: ModuleType) -> None:
    """The cold winner read 1.8 in the search and 2.0 when confirmed: the cold run still reached its best at
    the evaluation that measured it, and a warm run that measures the same kernel reaches it there too."""
    cold = run(bench, "t", [1.1, 1.8, 1.2], 2.0, shas=["a", "win", "b"], best_sha="win")
    same = run(bench, "t", [1.3, 1.7], 1.9, shas=["c", "win"])
    other = run(bench, "t", [1.3, 1.7], 1.9, shas=["c", "d"])  # another kernel must read the goal itself
    rows = [bench.row(cold, same, ARGS), bench.row(cold, other, ARGS)]
    assert rows[0]["cold_evals_counted"] == 2 and rows[0]["cold_reach"] == 2
    assert [r["warm_evals_counted"] for r in rows] == [2, ARGS.budget + 1]
    summary = bench.summarize(rows)
    assert summary["ratio"] == pytest.approx((2 + 7) / (2 + 2), abs=1e-3)
    assert summary["ratio_floor"] == pytest.approx(2 / 4)
    assert bench.cold_report({"t": cold}, ["t"], ARGS)["cold"]["t"]["reach"] == 2


def test_a_resumed_run_reads_its_cold_runs_back_and_refuses_other_settings(
        bench: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    args = argparse.Namespace(budget=6, time_s=900.0, confirm=3, target="cpu", keep=tmp_path, resume=None,
                              variants=False, variant_budget=20, variant_seed=1)
    root = bench.resume_root(args)
    assert root.parent == tmp_path and (root / "run-args.json").exists()
    ran: list[str] = []

    def session(data_dir: Path, task: str, *rest: object) -> object:
        ran.append(task)
        data_dir.mkdir()
        return run(bench, task, [1.5], 1.5)

    monkeypatch.setattr(bench, "run_in", session)
    first = bench.cold_phase(["a", "b"], root, None, args)
    (root / "cold-1" / "half-written").write_text("")  # b's dir as a run cut off mid-way would leave it
    lines = (root / bench.COLD_RUNS).read_text().splitlines()
    (root / bench.COLD_RUNS).write_text(lines[0] + "\n")  # only a finished
    resumed = bench.cold_phase(["a", "b"], root, None, args)
    assert ran == ["a", "b", "b"]  # a read back, b run again in a fresh dir
    assert resumed["a"] == first["a"] and not (root / "cold-1" / "half-written").exists()

    args.resume = root
    assert bench.resume_root(args) == root
    args.budget = 8
    with pytest.raises(ValueError, match="--budget 6 there, 8 here"):
        bench.resume_root(args)
    args.resume = tmp_path
    with pytest.raises(ValueError, match="no run-args.json"):
        bench.resume_root(args)


def test_with_min_cold_evals_one_every_task_is_measured_warm(bench: ModuleType) -> None:
    cold = {"early": run(bench, "early", [2.0], 2.0), "reference": run(bench, "reference", [0.9], 0.95, is_reference=True)}
    args = argparse.Namespace(tolerance=0.05, budget=6, min_cold_evals=1)
    assert bench.select_late(cold, list(cold), args) == (["early", "reference"], [])


def test_a_variant_is_answered_when_it_measures_its_originals_speedup_within_two_evaluations(bench: ModuleType) -> None:
    """The bar is the original's confirmed speedup less 10%, reached within two evaluations besides the
    baseline; a variant whose original returned the reference is not counted."""
    originals = {"a": run(bench, "a", [1.2, 2.0], 2.0), "r": run(bench, "r", [0.9], 0.9, is_reference=True)}

    def variant(name: str, kind: str, original: str, memory: str, readings: list[float | None]) -> object:
        return bench.VariantRun(variant=name, kind=kind, original=original, memory=memory,
                                run=run(bench, name, readings, max((r or 0.0) for r in readings)))

    runs = [variant("a__permute", "permute", "a", "warm", [1.85]),           # 1.85 >= 2.0 * 0.9: at 1
            variant("a__permute", "permute", "a", "cold", [1.2, 1.3, 1.9]),  # reached at 3: too late
            variant("a__dtype", "dtype", "a", "warm", [None, 1.5]),          # never reaches 1.8
            variant("a__dtype", "dtype", "a", "cold", [1.5]),
            variant("r__permute", "permute", "r", "warm", [1.0]),
            variant("r__permute", "permute", "r", "cold", [1.0]),
            variant("a__statics", "statics", "a", "warm", [1.9])]              # no cold run yet: left out
    rows = {r["variant"]: r for r in bench.variant_rows(originals, runs, 0.10)}
    assert set(rows) == {"a__permute", "a__dtype", "r__permute"}
    assert (rows["a__permute"]["warm_reach"], rows["a__permute"]["cold_reach"]) == (1, 3)
    assert rows["a__permute"]["warm_answered"] and not rows["a__permute"]["cold_answered"]
    assert rows["a__dtype"]["warm_reach"] is None and not rows["a__dtype"]["keeps_work"]
    summary = bench.variant_summary(list(rows.values()))
    assert summary["counted"] == 2 and summary["warm_answered"] == "1/2" and summary["cold_answered"] == "0/2"
    assert summary["warm_answered_keeping_work"] == "1/1"
