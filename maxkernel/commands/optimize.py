"""``maxkernel optimize TASK``: one optimization session on the actors with any brain; writes the kernel."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from jaxbench.report import format_speedup


def optimize_command(
    task: str = typer.Argument(..., help="suite id or task folder"),
    brain: str = typer.Option("rules", help="rules (no model) | gemini | openai | replay"),
    budget: float = typer.Option(300.0, help="seconds to spend"),
    evals: Optional[int] = typer.Option(None, help="evaluations to spend (default: no limit but the time)"),
    out: Path = typer.Option(Path("kernels"), help="folder for the best kernel file"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="write the result and every trial as JSON"),
    target: str = typer.Option("cpu", help="cpu | gpu | tpu-v4 | tpu-v5e | tpu-v5p | tpu-v6e | tpu-v7"),
    seed: int = typer.Option(0, help="seed of the tuner's search order"),
    model: Optional[str] = typer.Option(None, help="model preset of config/models.yaml (LLM brains)"),
    base_url: Optional[str] = typer.Option(None, help="OpenAI-compatible server URL (--brain openai)"),
    transcript: Optional[Path] = typer.Option(None, help="recorded session to replay (--brain replay)"),
    record: Optional[Path] = typer.Option(None, help="save every model exchange as JSON lines"),
    max_tokens: Optional[int] = typer.Option(None, help="token budget of the session (LLM brains)"),
    max_cost: Optional[float] = typer.Option(None, help="money budget in USD (LLM brains)"),
) -> None:
    """Optimize one task; exit 0 when a kernel file was written (a verified kernel, or the reference returned)."""
    from maxkernel.cli import guarded

    guarded(_optimize)(task, brain, budget, evals, out, json_out, target, seed, model, base_url, transcript, record,
                       max_tokens, max_cost)


def _optimize(task: str, brain: str, budget: float, evals: Optional[int], out: Path, json_out: Optional[Path],
              target: str, seed: int, model: Optional[str], base_url: Optional[str], transcript: Optional[Path],
              record: Optional[Path], max_tokens: Optional[int], max_cost: Optional[float]) -> None:
    from maxkernel.commands.checks import check_run
    from orchestrators.api import optimize

    loaded = check_run(task, brain, budget, evals, target, out, json_out)
    err = Console(stderr=True)
    with _Progress(err, loaded.id, budget) as on_event:
        result = optimize(task, target=target, budget_s=budget, evals=evals, brain=brain, seed=seed, model=model,
                          base_url=base_url, transcript=transcript, record_to=record, max_tokens=max_tokens,
                          max_cost_usd=max_cost, on_event=on_event)
    kernel_path = None
    # A verified kernel, or the reference returned (it may miss its own tolerance on the target: the note says so).
    returned = result.best_report is not None and (result.best_report.correct or result.best_strategy == "reference")
    if result.best_source and returned:
        out.mkdir(parents=True, exist_ok=True)
        kernel_path = out / f"{loaded.id}_{target}.py"
        kernel_path.write_text(result.best_source)
    _print(result, kernel_path)
    if json_out:
        json_out.write_text(result.model_dump_json(indent=2))
    raise typer.Exit(0 if kernel_path is not None else 1)


class _Progress:
    """A rich progress bar over the time budget, a line per trial, fed by the session's events."""

    def __init__(self, console: Console, task_id: str, budget: float) -> None:
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.task_id, self.budget = task_id, budget
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                                 console=console, transient=False)
        self.bar: Any = None

    def __enter__(self) -> Any:
        self.progress.__enter__()
        self.bar = self.progress.add_task(f"{self.task_id}: baseline", total=self.budget)
        return self.on_event

    def on_event(self, kind: str, data: dict[str, Any]) -> None:
        if kind == "iteration":
            self.progress.update(self.bar, description=f"{self.task_id}: {data['strategy']}")
        elif kind == "trial":
            speed = format_speedup(data["speedup"], data.get("speedup_ci")) if data.get("speedup") else data["status"]
            params = data["params"] or ""
            self.progress.console.print(f"  {data['role']:8} {data['strategy']} {params}: {speed}", highlight=False,
                                        markup=False)
        elif kind == "reference_numerics":
            self.progress.console.print(f"  note     {data['text']}", highlight=False, markup=False)
        elif kind == "confirm":
            self.progress.update(self.bar, description=f"{self.task_id}: re-measuring {data['strategy']}")
        self.progress.update(self.bar, completed=min(self.budget, self.progress.tasks[0].elapsed or 0.0))

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.progress.update(self.bar, completed=self.budget, description=f"{self.task_id}: done")
        self.progress.__exit__(*exc)  # type: ignore[arg-type]


def trials_table(result: Any) -> Table:
    """One row per trial. Words from a fixed set (role, status, label) are never split; what is free text
    (strategy, params) folds, and a speedup breaks only at the space before its interval."""
    table = Table(title=f"{result.task_id} · {result.target} · {result.brain} brain · session {result.session_id[:12]}")
    table.add_column("strategy", overflow="fold", ratio=2)
    table.add_column("role", no_wrap=True)
    table.add_column("params", overflow="fold", ratio=2)
    table.add_column("status", no_wrap=True)
    table.add_column("speedup", min_width=len("0.00x"), ratio=1)
    table.add_column("label", no_wrap=True)
    for row in result.trials:
        table.add_row(escape(row.strategy), row.role, escape(str(row.params or "")), row.status,
                      format_speedup(row.speedup, row.speedup_ci), row.label or "-")
    return table


def _print(result: Any, kernel_path: Path | None) -> None:
    console = Console()
    console.print(trials_table(result))
    report = result.best_report
    basis = ""
    if report is not None and report.basis:  # "modelled, deterministic" already names its basis: said once
        confirmation = result.confirmation or ""
        said = confirmation if confirmation.startswith(report.basis) else \
            ", ".join(x for x in (report.basis, confirmation) if x)
        basis = f" ({said})"
    colour = "green" if result.claim == "faster" else "yellow"
    params = {k: v for k, v in result.best_params.items() if k not in ("rewrites", "source")}
    console.print(f"best: {escape(result.best_strategy or '-')} {escape(str(params or ''))} — "
                  f"[{colour}]{escape(result.verdict)}[/]" + (escape(basis) if result.beat_reference else ""))
    if result.note and result.verdict not in result.note:  # the verdict is said once, on the line above
        console.print(result.note, highlight=False, markup=False)
    elif result.beat_reference and result.baseline_speedup:
        console.print("the reference itself, run as a candidate, scored "
                      f"{format_speedup(result.baseline_speedup, result.baseline_speedup_ci)}",
                      highlight=False, markup=False)
    console.print(f"session {result.session_id}: {result.status} ({result.stop_reason}); {result.evaluations} "
                  f"evaluation{'' if result.evaluations == 1 else 's'}, {result.seconds:.0f} s" + (f", tokens {result.tokens}, ${result.cost_usd:.4f}"
                                                             if result.tokens else ""), highlight=False, markup=False)
    if kernel_path is not None:
        console.print(f"kernel written to {kernel_path}", highlight=False)
