"""``maxkernel daemon start|stop|status``, ``submit``, ``jobs``, ``cancel``: the job queue from the shell.

Submitting and listing go straight to the job table in the store, so they work whether or not a daemon
runs; a daemon started later picks the queued jobs up.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from maxkernel.commands.formatting import speedup_text


def _queue() -> Any:
    from maxkernel.config import load_settings
    from memory import Store
    from orchestrators.jobs import JobQueue

    settings = load_settings()
    return JobQueue(Store.open(settings.resolved_store_url).engine)


def daemon_command(
    action: str = typer.Argument(..., help="start | stop | status"),
    concurrency: int = typer.Option(2, help="jobs run at the same time"),
    port: int = typer.Option(0, help="HTTP API port on 127.0.0.1 (0: any free port)"),
    foreground: bool = typer.Option(False, help="run in this process instead of detaching"),
) -> None:
    """Start, stop or inspect the daemon that works through the job queue."""
    from maxkernel.cli import guarded

    guarded(_daemon)(action, concurrency, port, foreground)


def _daemon(action: str, concurrency: int, port: int, foreground: bool) -> None:
    from maxkernel.cli import UserError
    from maxkernel.config import load_settings
    from orchestrators import daemon

    settings = load_settings()
    console = Console()
    if action == "start":
        running = daemon.read_state(settings)
        if running is not None:
            raise UserError(f"a daemon is already running (pid {running.pid}, port {running.port})")
        if concurrency < 1:
            raise UserError(f"--concurrency {concurrency}: must be at least 1")
        _check_port(port)
        if foreground:
            raise typer.Exit(daemon.main(["--concurrency", str(concurrency), "--port", str(port)]))
        try:
            state = daemon.spawn(settings, concurrency=concurrency, port=port)
        except RuntimeError as exc:
            raise UserError(str(exc)) from exc
        console.print(f"daemon started: pid {state.pid}; dashboard and API at http://127.0.0.1:{state.port}/",
                      highlight=False, soft_wrap=True)
    elif action == "stop":
        try:
            pid = daemon.stop(settings)
        except RuntimeError as exc:
            raise UserError(str(exc)) from exc
        if pid is None:
            raise UserError(f"no daemon is running for {settings.data_path}")
        console.print(f"daemon {pid} stopped", highlight=False)
    elif action == "status":
        state = daemon.read_state(settings)
        counts = _queue().counts()
        line = ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "no jobs"
        if state is None:
            console.print(f"no daemon running; jobs: {line}", highlight=False)
            raise typer.Exit(1)
        console.print(f"daemon pid {state.pid}, dashboard http://127.0.0.1:{state.port}/, concurrency {state.concurrency}; "
                      f"jobs: {line}", highlight=False)
    else:
        raise UserError(f"daemon {action!r}: choose start, stop or status")


def _check_port(port: int) -> None:
    """A port out of range or already taken is said here, not as a traceback in daemon.log."""
    from maxkernel.cli import UserError
    from maxkernel.commands.checks import check_port_free

    if not 0 <= port <= 65535:
        raise UserError(f"--port {port}: choose 1-65535, or 0 for any free port")
    if port:
        try:
            check_port_free("127.0.0.1", port)
        except UserError as exc:
            raise UserError(f"--port {port}: {exc}") from None


def submit_command(
    task: str = typer.Argument(..., help="suite id or task folder"),
    priority: int = typer.Option(0, help="higher runs first"),
    budget: float = typer.Option(900.0, help="seconds the job may run"),
    evals: int = typer.Option(60, help="evaluations the job may spend"),
    brain: str = typer.Option("rules", help="rules | gemini | openai"),
    target: str = typer.Option("cpu", help="cpu | gpu | tpu-v5e | ..."),
) -> None:
    """Queue an optimization job for the daemon."""
    from maxkernel.cli import guarded

    guarded(_submit)(task, priority, budget, evals, brain, target)


def _submit(task: str, priority: int, budget: float, evals: int, brain: str, target: str) -> None:
    from maxkernel.cli import UserError
    from maxkernel.commands.checks import check_limits, check_target
    from orchestrators.auto import AutoBudget
    from orchestrators.jobs import BadJob, JobSpec, check_spec

    check_limits(budget, evals)
    check_target(target)  # the daemon runs here: a bare gpu target needs a GPU here
    try:
        spec = check_spec(JobSpec(task=task, priority=priority, budget=AutoBudget(time_s=budget, max_evaluations=evals),
                                  brain=brain, target=target))
    except BadJob as exc:
        raise UserError(str(exc)) from exc
    job = _queue().submit(spec)
    Console().print(job.id, highlight=False)


def jobs_command(
    status: Optional[str] = typer.Option(None, help="only jobs in this status"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="write the jobs as JSON to this file ('-': stdout)"),
) -> None:
    """List the jobs, newest first, with why each failed one failed."""
    from maxkernel.cli import guarded

    guarded(_jobs)(status, json_out)


def _jobs(status: Optional[str], json_out: Optional[Path]) -> None:
    from maxkernel.cli import UserError
    from maxkernel.commands.checks import check_writable
    from orchestrators.jobs import STATUSES

    if status is not None and status not in STATUSES:
        raise UserError(f"--status {status}: choose one of {', '.join(STATUSES)}")
    if json_out is not None and str(json_out) != "-":
        check_writable(json_out, "--json")
    jobs = _queue().list(status)
    if json_out is not None:
        text = json.dumps([j.model_dump(mode="json") for j in jobs], indent=2)
        if str(json_out) == "-":
            print(text)
        else:
            json_out.write_text(text)
        return
    table = Table(title="jobs")
    table.add_column("id", no_wrap=True, min_width=12)
    for col in ("task", "priority", "status", "best", "tries", "created", "reason"):
        table.add_column(col, overflow="fold")
    for j in jobs:
        best = "-"
        if j.result and j.result.get("best_report"):
            report = j.result["best_report"]
            best = f"{speedup_text(report.get('speedup'), report.get('speedup_ci'))} {j.result.get('best_strategy', '')}"
        elif j.result and j.result.get("layer"):  # a whole-layer job (maxkernel optimize-model's result)
            best = f"{speedup_text(j.result.get('speedup'), j.result.get('speedup_ci'))} layer"
        table.add_row(j.id[:12], escape(j.task_id), str(j.priority), j.status, escape(best), str(j.attempts),
                      j.created_at.strftime("%Y-%m-%d %H:%M:%S"), escape(j.error or "-"))
    Console().print(table)


def cancel_command(job: str = typer.Argument(..., help="job id or a unique prefix")) -> None:
    """Cancel a queued or running job."""
    from maxkernel.cli import guarded

    guarded(_cancel)(job)


def _cancel(job: str) -> None:
    from maxkernel.cli import UserError
    from orchestrators.jobs import JobNotActive, UnknownJob

    try:
        info = _queue().cancel(job)
    except (UnknownJob, JobNotActive) as exc:
        raise UserError(str(exc)) from exc
    Console().print(f"{info.id}: {info.status}", highlight=False)
