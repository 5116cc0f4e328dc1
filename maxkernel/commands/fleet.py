"""``maxkernel fleet up|down|status``: a local fleet on loopback (PostgreSQL, a Chroma server, the gRPC
host, daemons and supervised tester workers) for trying many processes on one machine."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table


def fleet_command(
    action: str = typer.Argument(..., help="up | down | status"),
    daemons: int = typer.Option(2, help="daemons on the shared queue"),
    testers: int = typer.Option(2, help="tester workers kept alive on the gRPC host; they judge the daemons' jobs "
                                        "(0: each daemon judges its own)"),
    concurrency: int = typer.Option(1, help="jobs each daemon runs at once"),
    spares: int = typer.Option(1, help="standby tester workers kept warm, each taking a dead tester's place at once"),
    daemon_spares: int = typer.Option(1, help="standby daemons kept warm (imported, store and memory open), each "
                                              "taking a dead daemon's place at once"),
    dir: Optional[Path] = typer.Option(None, "--dir", help="the fleet's folder (default: <data dir>/fleet)"),
) -> None:
    """Start, stop or inspect a fleet on 127.0.0.1; its jobs are submitted with MAXKERNEL_STORE_URL set to
    the URL that `up` prints."""
    from maxkernel.cli import guarded

    guarded(_fleet)(action, daemons, testers, concurrency, spares, daemon_spares, dir)


def _fleet(action: str, daemons: int, testers: int, concurrency: int, spares: int, daemon_spares: int,
           folder: Path | None) -> None:
    from maxkernel.cli import UserError
    from maxkernel.config import load_settings
    from orchestrators import fleet

    root = (folder or load_settings().data_path / "fleet").expanduser().resolve()
    console = Console()
    try:
        if action == "up":
            if min(daemons, testers, spares, daemon_spares) < 0 or concurrency < 1:
                raise UserError("--daemons, --testers, --spares and --daemon-spares must be at least 0, "
                                "--concurrency at least 1")
            state = fleet.up(root, daemons=daemons, testers=testers, concurrency=concurrency, spares=spares,
                             daemon_spares=daemon_spares)
            console.print(f"fleet up in {root}: {len(state.procs)} processes", highlight=False)
            console.print(f"MAXKERNEL_STORE_URL={state.store_url}", highlight=False)
            console.print(f"MAXKERNEL_CHROMA_URL={state.chroma_url}", highlight=False)
            console.print(f"gRPC host {state.host}", highlight=False)
        elif action == "down":
            stopped = fleet.down(root)
            console.print(f"fleet down: stopped {len(stopped)} processes", highlight=False)
        elif action == "status":
            table = Table("process", "pid", "alive", "port", "doing")
            for row in fleet.status(root):
                table.add_row(row["name"], str(row["pid"]), "yes" if row["alive"] else "[red]no[/]",
                              str(row["port"] or ""), row["doing"])
            console.print(table)
        else:
            raise UserError(f"unknown fleet action {action!r} (up, down or status)")
    except fleet.FleetError as exc:
        raise UserError(str(exc)) from exc
