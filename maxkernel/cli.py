"""The ``maxkernel`` command line. Orchestrators and heavy modules are imported inside commands."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Callable, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Write and optimize JAX/Pallas kernels.")
console = Console()
err_console = Console(stderr=True)


class UserError(Exception):
    """An error the user can fix: printed as one line, exit code 2."""


def fail(message: str, code: int = 2) -> None:
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn known user-caused exceptions into one clear line and a non-zero exit."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from jaxbench.task import TaskError
        from maxkernel.config import ConfigError
        from maxkernel.llm.errors import LlmError
        from maxkernel.targets.names import TargetError

        try:
            return fn(*args, **kwargs)
        except (TaskError, ConfigError, UserError, TargetError, LlmError) as exc:
            fail(str(exc))
        except FileNotFoundError as exc:
            fail(f"{exc.filename}: no such file")

    return wrapper


def _progress() -> Progress:
    return Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                    TimeElapsedColumn(), console=err_console, transient=False)


@app.callback()
def main(log_level: str = typer.Option("warning", help="debug|info|warning|error")) -> None:
    from maxkernel.logging import configure

    configure(log_level)


@app.command("tasks")
@guarded
def tasks_cmd() -> None:
    """List the JaxBench suite."""
    from jaxbench.task import list_tasks

    table = Table(title="JaxBench")
    for col in ("id", "category", "dtype", "cpu size", "tolerance"):
        table.add_column(col)
    for task in list_tasks():
        tol = task.spec.tolerance
        size = ", ".join(f"{k}={v}" for k, v in task.spec.sizes["cpu"].items())
        table.add_row(task.id, task.spec.category, task.spec.dtype, size, f"{tol.atol:g}/{tol.rtol:g}")
    console.print(table)


@app.command("bench")
@guarded
def bench_cmd(
    tasks: list[str] = typer.Argument(None, help="suite ids or task folders (default: the whole suite)"),
    size: str = typer.Option("cpu", help="cpu|full"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="write the rows as JSON"),
) -> None:
    """Reference timings of the suite with GFLOP/s and GB/s from XLA cost analysis."""
    from jaxbench.bench import bench_task
    from jaxbench.task import list_tasks, load_task

    selected = [load_task(t) for t in tasks] if tasks else list_tasks()
    rows = []
    with _progress() as progress:
        bar = progress.add_task("benchmarking references", total=len(selected))
        for task in selected:
            progress.update(bar, description=f"benchmarking {task.id}")
            rows.append(bench_task(task, size))
            progress.advance(bar)
    table = Table(title=f"reference timings ({size} size)")
    for col, justify in (("task", "left"), ("category", "left"), ("ms", "right"), ("GFLOP/s", "right"), ("GB/s", "right")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for row in rows:
        table.add_row(row.task, row.category, f"{row.ms:.2f}", _fmt(row.gflops), _fmt(row.gbytes_s))
    console.print(table)
    if json_out:
        json_out.write_text(json.dumps([r.model_dump() for r in rows], indent=2))


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


@app.command("eval")
@guarded
def eval_cmd(
    task: str = typer.Argument(..., help="suite id or task folder"),
    candidate: Path = typer.Argument(..., help="candidate .py file defining kernel()"),
    target: str = typer.Option("cpu", help="cpu | gpu | tpu-v4 | tpu-v5e | tpu-v5p | tpu-v6e | tpu-v7"),
    size: str = typer.Option("cpu", help="input size to run at"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="write the report as JSON"),
) -> None:
    """Evaluate one candidate; exit 0 only when it is correct."""
    from jaxbench.task import load_task
    from maxkernel.evaluation import evaluate_candidate

    loaded = load_task(task)
    if not candidate.is_file():
        raise UserError(f"{candidate}: no such candidate file")
    source = candidate.read_text()
    with err_console.status("evaluating") as status:
        report = evaluate_candidate(loaded, source, target=target, size=size, filename=str(candidate),
                                    progress=lambda stage: status.update(f"evaluating: {stage}"))
    print_report(report)
    if json_out:
        json_out.write_text(report.model_dump_json(indent=2))
    raise typer.Exit(0 if report.correct else 1)


def print_report(report: Any) -> None:
    checks = Table(title=f"{report.task} · {report.target} · {report.size}")
    checks.add_column("check")
    checks.add_column("result")
    checks.add_column("detail", overflow="fold")
    for c in report.checks:
        checks.add_row(c.name, "[green]pass[/]" if c.passed else "[red]FAIL[/]", c.detail)
    console.print(checks)
    colour = "green" if report.status == "ok" else "red"
    summary = Table(show_header=False)
    summary.add_column("field")
    summary.add_column("value", overflow="fold")
    summary.add_row("status", f"[{colour}]{report.status}[/]")
    if report.reason:
        summary.add_row("reason", report.reason)
    summary.add_row("label", str(report.label or "-"))
    summary.add_row("max abs err", _fmt_sci(report.max_abs_err))
    basis = f" ({report.basis})" if report.basis else ""
    summary.add_row("reference ms" + basis, _fmt_opt(report.ref_ms))
    summary.add_row("kernel ms" + basis, _fmt_opt(report.kernel_ms))
    summary.add_row("speedup", f"{report.speedup:.3f}x" if report.speedup else "-")
    summary.add_row("cv (kernel / ref)", f"{_fmt_opt(report.cv)} / {_fmt_opt(report.ref_cv)}")
    summary.add_row("FLOPs (ref / kernel)", f"{_fmt_sci(report.ref_flops)} / {_fmt_sci(report.kernel_flops)}")
    for flag in report.flags:
        summary.add_row("flag", f"[yellow]{flag}[/]")
    console.print(summary)


def _fmt_opt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _fmt_sci(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


@app.command(
    "memory",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def memory_cmd(ctx: typer.Context) -> None:
    """The memory of verified kernels and notes: list | search | show | export | import | stats | reindex."""
    from memory.cli import app as memory_app  # imported on use: Chroma and the store are heavy to load

    memory_app(args=list(ctx.args), prog_name="maxkernel memory")


@app.command("host", context_settings={"allow_extra_args": True, "ignore_unknown_options": True}, add_help_option=False)
def host_cmd(ctx: typer.Context) -> None:
    """Run the gRPC host that actors on many machines connect to (ADDRESS, e.g. 0.0.0.0:50051)."""
    from actors.host import main as host_main

    raise typer.Exit(host_main(list(ctx.args)))


@app.command("worker", context_settings={"allow_extra_args": True, "ignore_unknown_options": True}, add_help_option=False)
def worker_cmd(ctx: typer.Context) -> None:
    """Run actors on this machine against a gRPC host (--host HOST:PORT --roles tester,... --config FILE)."""
    from actors.worker import main as worker_main

    raise typer.Exit(worker_main(list(ctx.args)))


def _register_commands() -> None:
    """Commands whose modules import their heavy parts (rules, actors, orchestrators) only when run."""
    from maxkernel.commands.analyze import analyze_command
    from maxkernel.commands.chat import chat_command
    from maxkernel.commands.daemon import cancel_command, daemon_command, jobs_command, submit_command
    from maxkernel.commands.fleet import fleet_command
    from maxkernel.commands.optimize import optimize_command
    from maxkernel.commands.report import report_command
    from maxkernel.commands.search import search_command

    app.command("analyze")(analyze_command)
    app.command("optimize")(optimize_command)
    app.command("search")(search_command)
    app.command("chat")(chat_command)
    app.command("daemon")(daemon_command)
    app.command("submit")(submit_command)
    app.command("jobs")(jobs_command)
    app.command("cancel")(cancel_command)
    app.command("report")(report_command)
    app.command("fleet")(fleet_command)


_register_commands()


def run() -> None:
    app()


if __name__ == "__main__":
    sys.exit(app())
