"""``maxkernel analyze TASK``: the op graph, patterns, FLOPs, bytes and the bound of a reference."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console


def analyze_command(
    task: str = typer.Argument(..., help="suite id or task folder"),
    target: str = typer.Option("cpu", help="cpu | gpu | tpu-v4 | tpu-v5e | tpu-v5p | tpu-v6e | tpu-v7"),
    size: str = typer.Option("cpu", help="input size to analyze at (cpu | full)"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="write the analysis as JSON"),
) -> None:
    """Describe what a task's reference computes and what bounds it on the target."""
    from maxkernel.cli import guarded

    guarded(_analyze)(task, target, size, json_out)


def _analyze(task: str, target: str, size: str, json_out: Optional[Path]) -> None:
    from jaxbench.task import load_task
    from maxkernel.analysis import analyze_task
    from maxkernel.commands.checks import check_writable
    from maxkernel.targets.names import parse_target

    parse_target(target)
    loaded = load_task(task)
    loaded.size(size)  # a bad size is one clear line (TaskError)
    if json_out is not None:
        check_writable(json_out, "--json")  # before the work, not after it
    console = Console()
    with Console(stderr=True).status(f"analyzing {loaded.id}"):
        analysis = analyze_task(loaded, target, size)
    console.print(analysis.summary(), highlight=False, markup=False, soft_wrap=True)
    if json_out:
        json_out.write_text(analysis.model_dump_json(indent=2))
