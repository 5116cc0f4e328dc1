"""``maxkernel report SESSION|SEARCH|JOB``: one self-contained HTML report, read from the store."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console


def report_command(
    subject: str = typer.Argument(..., help="a session, search or daemon job id"),
    out: Optional[Path] = typer.Option(None, help="HTML file to write (default reports/<id>.html)"),
) -> None:
    """Write the HTML report of a session, a search or a job."""
    from maxkernel.cli import guarded

    guarded(_report)(subject, out)


def _report(subject: str, out: Optional[Path]) -> None:
    from maxkernel.cli import UserError
    from maxkernel.commands.checks import check_writable
    from maxkernel.config import load_settings
    from memory import Store
    from orchestrators.report import UnknownSubject, write_report
    from orchestrators.tables import resolve_id

    if out is not None:
        check_writable(out, "--out")
    with Store.open(load_settings().resolved_store_url) as store:
        full_id = resolve_id(store, subject)[1]
        try:
            path = write_report(store, full_id, out or Path("reports") / f"{full_id[:16]}.html")
        except (UnknownSubject, LookupError) as exc:
            raise UserError(str(exc)) from exc
    Console().print(f"report written to {path}", highlight=False)
