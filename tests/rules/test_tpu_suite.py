"""The TPU suite benchmark's counting: what counts as a Pallas kernel modelled faster, and the geomean."""

from __future__ import annotations

import math

from benchmarks.suite_speedup import main, pallas_faster, tpu_row, tpu_summary


def _ours(strategy: str, label: str | None, speedup: float | None, beat: bool, trials: list[str] | None = None,
          status: str = "ok") -> dict[str, object]:
    return {"strategy": strategy, "params": {}, "label": label, "status": status, "speedup": speedup,
            "beat_reference": beat, "seconds": 1.0, "note": "", "trials": trials or []}


def test_only_pallas_winners_faster_than_the_reference_count_and_failures_count_one() -> None:
    rows = [
        tpu_row("a", _ours("template:tpu_gemm", "pallas-kernel", 4.0, True,
                           ["template:tpu_gemm {'block_m': 512}: ok 4.00x", "template:rowblock {'block_rows': 8}: rejected why"])),
        tpu_row("b", _ours("rewrite:scalar_chains", "jax", 2.0, True)),
        tpu_row("c", _ours("reference", "reference-equivalent", 1.0, False)),
        tpu_row("d", _ours("error", None, None, False, status="error")),
        tpu_row("e", _ours("template:fused_tail", "pallas-kernel", 1.0, False)),
    ]
    assert [pallas_faster(r) for r in rows] == [True, False, False, False, False]
    assert rows[0]["pallas_tried"] == {"tpu_gemm": ["ok"], "rowblock": ["rejected"]}
    summary = tpu_summary(rows)
    assert summary["pallas_faster"] == 1 and summary["jax_faster"] == 1 and summary["errors"] == 1
    assert math.isclose(summary["geomean"], (4.0 * 2.0) ** (1 / 5))


def test_an_unknown_target_is_one_line_and_exit_code_2(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["--target", "tpu-v9", "--tasks", "12p_RMSNorm"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown target 'tpu-v9'" in err[0]


def test_two_runs_compare_task_by_task_on_the_tasks_both_reached(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    import json

    before = [tpu_row("12p_RMSNorm", _ours("reference", "reference-equivalent", 1.0, False)),
              tpu_row("13p_Cross_Entropy", _ours("template:tpu_xent", "pallas-kernel", 3.0, True))]
    after = [tpu_row("13p_Cross_Entropy", _ours("template:fused_grid", "pallas-kernel", 3.6, True)),
             tpu_row("12p_RMSNorm", _ours("reference", "reference-equivalent", 1.0, False)),
             tpu_row("14p_Ragged_Dot", _ours("template:grouped_matmul", "pallas-kernel", 2.0, True))]
    for name, rows, budget in (("a", before, 20.0), ("b", after, 20.0), ("c", after, 30.0)):
        (tmp_path / f"{name}.json").write_text(json.dumps({"target": "tpu-v6e", "budget_s": budget, "rows": rows}))
    assert main(["--compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0
    out = capsys.readouterr().out
    assert "| 13p_Cross_Entropy | tpu_xent | 3.00x | fused_grid | 3.60x | 1.20 |" in out
    assert "14p_Ragged_Dot" not in out  # reached by one run only
    assert "after: a Pallas kernel faster on 1/2" in out
    assert main(["--compare", str(tmp_path / "a.json"), str(tmp_path / "c.json")]) == 2  # budgets differ
    assert "differ in target or budget" in capsys.readouterr().err
