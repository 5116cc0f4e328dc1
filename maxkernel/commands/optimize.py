"""``maxkernel optimize TASK --brain rules``: run the model-free optimizer and write the best kernel."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table


def optimize_command(
    task: str = typer.Argument(..., help="suite id or task folder"),
    brain: str = typer.Option("rules", help="rules (no model) | gemini | openai | replay"),
    budget: float = typer.Option(300.0, help="seconds to spend (rules brain)"),
    out: Path = typer.Option(Path("kernels"), help="folder for the best kernel file"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="write the result and every trial as JSON"),
    target: str = typer.Option("cpu", help="cpu | gpu | tpu-v4 | tpu-v5e | tpu-v5p | tpu-v6e | tpu-v7"),
    seed: int = typer.Option(0, help="seed of the search order"),
    model: Optional[str] = typer.Option(None, help="model preset of config/models.yaml (LLM brains)"),
    base_url: Optional[str] = typer.Option(None, help="OpenAI-compatible server URL (--brain openai)"),
    transcript: Optional[Path] = typer.Option(None, help="recorded session to replay (--brain replay)"),
    record: Optional[Path] = typer.Option(None, help="save every model exchange as JSON lines"),
    max_tokens: Optional[int] = typer.Option(None, help="token budget of the session (LLM brains)"),
    max_cost: Optional[float] = typer.Option(None, help="money budget in USD (LLM brains)"),
) -> None:
    """Optimize one task; exit 0 when a correct kernel file was written."""
    from maxkernel.cli import guarded

    if brain == "rules":
        guarded(_optimize)(task, brain, budget, out, json_out, target, seed)
    else:
        guarded(_optimize_with_actors)(task, brain, out, json_out, target, model, base_url, transcript, record,
                                       max_tokens, max_cost)


def _optimize_with_actors(task: str, brain: str, out: Path, json_out: Optional[Path], target: str,
                          model: Optional[str], base_url: Optional[str], transcript: Optional[Path],
                          record: Optional[Path], max_tokens: Optional[int], max_cost: Optional[float]) -> None:
    """An LLM brain: one session through the actors (planner, coder, tester, debugger, profiler, tuner)."""
    from actors.session import BRAINS, optimize
    from jaxbench.task import load_task
    from maxkernel.cli import UserError, print_report
    from maxkernel.targets.names import parse_target

    if brain not in BRAINS:
        raise UserError(f"--brain {brain}: choose one of {', '.join(BRAINS)}")
    parse_target(target)
    loaded = load_task(task)
    err = Console(stderr=True)
    with err.status(f"{loaded.id}: {brain} session") as status:
        result = optimize(str(loaded.path), brain, model=model, base_url=base_url, transcript=transcript,
                          record_to=record, target=target, max_tokens=max_tokens, max_cost_usd=max_cost,
                          on_message=lambda m: status.update(f"{loaded.id}: {type(m).__name__}"))
    if result.report is not None:
        print_report(result.report)
    console = Console()
    console.print(f"session {result.session_id}: {result.status} {escape(result.reason)} "
                  f"(tokens {result.tokens}, ${result.cost_usd:.4f})", highlight=False)
    if result.source and result.report is not None and result.report.correct:
        out.mkdir(parents=True, exist_ok=True)
        kernel_path = out / f"{loaded.id}_{target}.py"
        kernel_path.write_text(result.source)
        console.print(f"kernel written to {kernel_path}", highlight=False)
    if json_out:
        json_out.write_text(result.model_dump_json(indent=2))
    raise typer.Exit(0 if result.status == "scored" and result.report is not None and result.report.correct else 1)


def _optimize(task: str, brain: str, budget: float, out: Path, json_out: Optional[Path], target: str, seed: int) -> None:
    from jaxbench.task import load_task
    from maxkernel.cli import UserError
    from maxkernel.targets.names import parse_target

    if budget <= 0:
        raise UserError(f"--budget {budget}: must be positive")
    parse_target(target)
    loaded = load_task(task)
    if out.exists() and not out.is_dir():
        raise UserError(f"{out}: exists and is not a folder")

    err = Console(stderr=True)
    result = _run(loaded, target, budget, seed, err)
    out.mkdir(parents=True, exist_ok=True)
    kernel_path = out / f"{loaded.id}_{target}.py"
    kernel_path.write_text(result.best_source)
    _print(result, kernel_path)
    if json_out:
        json_out.write_text(json.dumps(result.model_dump(mode="json"), indent=2))
    raise typer.Exit(0 if result.best_report is not None and result.best_report.correct else 1)


def _run(loaded: Any, target: str, budget: float, seed: int, err: Console) -> Any:
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from maxkernel.rules import optimize_rules

    progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                        console=err, transient=False)
    with progress:
        bar = progress.add_task(f"{loaded.id}: analyzing", total=budget)

        def on_event(kind: str, data: dict[str, Any]) -> None:
            if kind == "strategy":
                progress.update(bar, description=f"{loaded.id}: {data['name']}")
            elif kind == "trial":
                speed = f"{data['speedup']:.2f}x" if data.get("speedup") else data["status"]
                progress.console.print(f"  {data['strategy']} {data['params'] or ''}: {speed}", highlight=False, markup=False)
            elif kind == "confirm":
                progress.update(bar, description=f"{loaded.id}: re-measuring {data['strategy']}")
            progress.update(bar, completed=min(budget, progress.tasks[0].elapsed or 0.0))

        result = optimize_rules(loaded, target=target, budget_s=budget, on_event=on_event, seed=seed)
        progress.update(bar, completed=budget, description=f"{loaded.id}: done")
    return result


def _print(result: Any, kernel_path: Path) -> None:
    console = Console()
    table = Table(title=f"{result.task} · {result.target} · rules brain")
    for col in ("strategy", "params", "status", "speedup", "label"):
        table.add_column(col, overflow="fold")
    for trial in result.tried:
        r = trial.report
        params = {k: v for k, v in trial.params.items() if k != "rewrites"}
        table.add_row(escape(trial.strategy), escape(str(params or "")), r.status, f"{r.speedup:.2f}x" if r.speedup else "-", r.label or "-")
    console.print(table)
    report = result.best_report
    basis = f" ({report.basis})" if report is not None and report.basis else ""
    speed = f"{report.speedup:.2f}x{basis}" if result.beat_reference and report is not None and report.speedup else "1.00x"
    verdict = "[green]faster than the reference[/]" if result.beat_reference else "[yellow]no candidate beat the reference[/]"
    params = {k: v for k, v in result.best_params.items() if k != "rewrites"}
    console.print(f"best: {escape(result.best_strategy)} {escape(str(params or ''))} — {speed} — {verdict}")
    console.print(result.note, highlight=False, markup=False)
    console.print(f"kernel written to {kernel_path}", highlight=False)
