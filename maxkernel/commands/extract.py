"""``maxkernel extract TASK``: split a task's reference into region tasks and show where its time goes."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table


def extract_command(
    task: str = typer.Argument(..., help="suite id, model layer id or task folder"),
    target: str = typer.Option("cpu", help="cpu (shares measured) | tpu-v4 | tpu-v5e | tpu-v5p | tpu-v6e | tpu-v7 (modelled)"),
    out: Path = typer.Option(Path("regions"), help="folder the region tasks are written under"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="write the regions as JSON"),
) -> None:
    """Write one task folder per region of TASK and print a table: region, kind, share of time, FLOPs, bytes."""
    from maxkernel.cli import guarded

    guarded(_extract)(task, target, out, json_out)


def _extract(task: str, target: str, out: Path, json_out: Optional[Path]) -> None:
    from jaxbench.task import load_task
    from maxkernel.cli import UserError
    from maxkernel.commands.checks import check_folder, check_writable
    from maxkernel.extract import ExtractError, extract_task
    from maxkernel.targets.names import parse_target

    parse_target(target)
    loaded = load_task(task)
    check_folder(out, "--out")
    if json_out is not None:
        check_writable(json_out, "--json")  # before any region folder is written
    try:
        with Console(stderr=True).status(f"extracting {loaded.id}"):
            extraction = extract_task(loaded, out, target=target)
    except ExtractError as exc:
        raise UserError(str(exc)) from exc
    print_regions(extraction)
    if json_out:
        json_out.write_text(extraction.model_dump_json(indent=2))


def print_regions(extraction: object) -> None:
    """The region table of an extraction."""
    from maxkernel.extract import Extraction

    assert isinstance(extraction, Extraction)
    basis = extraction.regions[0].basis if extraction.regions else "measured"
    table = Table(title=f"{extraction.layer}: {len(extraction.regions)} region{'' if len(extraction.regions) == 1 else 's'} "
                        f"({extraction.target}, {basis})")
    for col, justify in (("region", "left"), ("kind", "left"), ("share", "right"), ("ms", "right"),
                         ("GFLOP (cpu size)", "right"), ("MB (cpu size)", "right"), ("folder", "left")):
        table.add_column(col, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for r in extraction.regions:
        table.add_row(r.task_id.split("__")[-1], r.kind, f"{100 * r.share:.1f}%", f"{r.ms:.3g}" if r.ms else "-",
                      f"{r.flops / 1e9:.3f}", f"{r.bytes / 1e6:.2f}", r.path)
    console = Console()
    console.print(table)
    console.print(f"extracted in {extraction.seconds:.1f} s", highlight=False)
