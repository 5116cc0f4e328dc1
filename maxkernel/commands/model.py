"""``maxkernel optimize-model TASK``: optimize a whole layer region by region and judge the re-joined layer."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from jaxbench.report import format_speedup


def optimize_model_command(
    task: str = typer.Argument(..., help="model layer id or task folder"),
    budget: float = typer.Option(300.0, help="seconds to spend over all regions"),
    evals: Optional[int] = typer.Option(None, help="evaluations over all regions, shared like the time "
                                                   "(default: no limit but the time)"),
    target: str = typer.Option("cpu", help="cpu (measured) | tpu-v4 | tpu-v5e | tpu-v5p | tpu-v6e | tpu-v7 (modelled)"),
    brain: str = typer.Option("rules", help="rules (no model) | gemini | openai | replay"),
    out: Path = typer.Option(Path("kernels"), help="folder for the layer kernel and the region tasks"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="write the result as JSON (carries `speedup`)"),
    seed: int = typer.Option(0, help="seed of the tuners' search order"),
) -> None:
    """Optimize a layer; exit 0 when a correct layer kernel was written."""
    from maxkernel.cli import guarded

    guarded(_optimize_model)(task, budget, evals, target, brain, out, json_out, seed)


def _optimize_model(task: str, budget: float, evals: Optional[int], target: str, brain: str, out: Path,
                    json_out: Optional[Path], seed: int) -> None:
    from maxkernel.cli import UserError
    from maxkernel.commands.checks import check_run
    from maxkernel.extract import ExtractError
    from orchestrators.model_opt import optimize_model

    loaded = check_run(task, brain, budget, evals, target, out, json_out)
    err = Console(stderr=True)

    def said(row: object) -> None:
        err.print(f"  {getattr(row, 'task_id')}: {getattr(row, 'status')}", highlight=False, markup=False)

    try:
        with err.status(f"optimizing {loaded.id} region by region"):
            result = optimize_model(loaded.path, out=out, budget_s=budget, evals=evals, target=target, brain=brain,
                                    seed=seed, on_region=said)
    except ExtractError as exc:
        raise UserError(str(exc)) from exc
    _print(result)
    if json_out:
        json_out.write_text(result.model_dump_json(indent=2))
    raise typer.Exit(0 if result.kernel_path else 1)


def _print(result: object) -> None:
    from orchestrators.model_opt import ModelResult

    assert isinstance(result, ModelResult)
    console = Console()
    table = Table(title=f"{result.layer} · {result.target} · regions")
    for col in ("region", "kind", "share", "budget s", "before ms", "after ms", "speedup", "strategy", "status"):
        table.add_column(col, overflow="fold")
    for r in result.regions:
        table.add_row(r.task_id.split("__")[-1], r.kind, f"{100 * r.share:.1f}%", f"{r.budget_s:.0f}",
                      f"{r.before_ms:.3g}" if r.before_ms else "-", f"{r.after_ms:.3g}" if r.after_ms else "-",
                      format_speedup(r.speedup, r.speedup_ci), r.strategy or "-",
                      r.status + (f" ({r.note})" if r.note else ""))
    console.print(table)
    if result.judgement_reserve_s:
        console.print(f"{result.judgement_reserve_s:.0f} s of the budget kept for judging the re-joined layer; "
                      "what a region's session left unused went to the regions after it", highlight=False)
    for note in result.notes:
        console.print(note, highlight=False, markup=False)
    if result.correct and result.speedup is not None:
        console.print(f"layer: {format_speedup(result.speedup, result.speedup_ci)} ({result.basis}; "
                      f"{result.ref_ms:.4g} -> {result.kernel_ms:.4g} ms), "
                      f"Amdahl bound of the kept regions {result.amdahl_bound:.2f}x", highlight=False)
    else:
        console.print("[red]no correct layer candidate[/]")
    if result.kernel_path:
        what = "the reference itself" if result.returned_reference else "layer kernel"
        console.print(f"{what} written to {result.kernel_path}", highlight=False)
