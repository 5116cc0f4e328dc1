"""The ``maxkernel`` command line. Orchestrators and heavy modules are imported inside commands."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from maxkernel.clierrors import OneLineTyper, UserError, fail, guarded
from maxkernel.commands.formatting import speedup_text

app = OneLineTyper(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                   help="Write and optimize JAX/Pallas kernels.")
console = Console()
err_console = Console(stderr=True)


__all__ = ["UserError", "fail", "guarded", "app", "run"]


def _progress() -> Progress:
    return Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                    TimeElapsedColumn(), console=err_console, transient=False)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            console.print(f"maxkernel {version('maxkernel')}", highlight=False)
        except PackageNotFoundError:
            fail("maxkernel is not installed as a package: run pip install -e .")
        raise typer.Exit(0)


@app.callback()
def main(
    log_level: str = typer.Option("warning", help="debug|info|warning|error"),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="print the version"),
) -> None:
    """Settings are read here, before any command, so that a bad one is refused the same way everywhere."""
    from maxkernel.config import ConfigError, load_settings
    from maxkernel.logging import configure

    if log_level not in ("debug", "info", "warning", "error"):
        fail(f"--log-level {log_level}: choose debug, info, warning or error")
    try:
        load_settings()
    except ConfigError as exc:
        fail(exc)
    configure(log_level)


@app.command("tasks")
@guarded
def tasks_cmd(models: bool = typer.Option(False, "--models", help="list the model layers instead")) -> None:
    """List the JaxBench suite (or its model layers)."""
    from jaxbench.task import list_models, list_tasks

    suite = list_models() if models else list_tasks()
    console.print(suite_view(suite, "JaxBench model layers" if models else "JaxBench", console.width))


def suite_view(suite: list[Any], title: str, width: int) -> Any:
    """A table where it fits the terminal; else one block per task (its id whole on a line of its own, the rest
    wrapped beneath it), since a column squeezed to two characters stacks its words letter by letter."""
    from rich.console import Group
    from rich.padding import Padding
    from rich.text import Text

    rows = [(t.id, t.spec.category, t.spec.dtype, ", ".join(f"{k}={v}" for k, v in t.spec.sizes["cpu"].items()),
             f"{t.spec.tolerance.atol:g}/{t.spec.tolerance.rtol:g}") for t in suite]
    id_width = max(len(r[0]) for r in rows)
    # id, category, dtype and tolerance whole, and room for the sizes to wrap at a reasonable width
    needed = id_width + max(len(r[1]) for r in rows) + max(len(r[2]) for r in rows) + 30 + 11 + 16
    if width >= needed:
        table = Table(title=title)
        table.add_column("id", no_wrap=True)  # ids are copied into other commands: never cut
        for col in ("category", "dtype"):
            table.add_column(col, no_wrap=True)
        table.add_column("cpu size", overflow="fold", min_width=20)
        table.add_column("tolerance", no_wrap=True)
        for row in rows:
            table.add_row(*row)
        return table
    blocks: list[Any] = [Text(f"{title} ({len(rows)} tasks; atol/rtol tolerances)", style="bold")]
    for task_id, category, dtype, size, tolerance in rows:
        blocks.append(Text(task_id, style="bold cyan", no_wrap=True, overflow="ignore"))
        blocks.append(Padding(Text(f"{category} · {dtype} · tol {tolerance} · cpu size {size}"), (0, 0, 0, 4),
                              expand=False))
    return Group(*blocks)


@app.command("bench")
@guarded
def bench_cmd(
    tasks: list[str] = typer.Argument(None, help="suite ids or task folders (default: the whole suite)"),
    size: str = typer.Option("cpu", help="cpu|full"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="write the rows as JSON"),
) -> None:
    """Reference timings of the suite with GFLOP/s and GB/s from XLA cost analysis."""
    from jaxbench.bench import bench_task
    from maxkernel.commands.checks import check_writable
    from jaxbench.task import list_tasks, load_task

    if size not in ("cpu", "full"):
        raise UserError(f"--size {size}: choose cpu or full")
    if json_out is not None:
        check_writable(json_out, "--json")
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
    from maxkernel.commands.checks import check_target, check_writable
    from maxkernel.config import load_settings
    from maxkernel.evaluation import evaluate_candidate, evaluator_from

    check_target(target)
    loaded = load_task(task)
    if not candidate.is_file():
        raise UserError(f"{candidate}: no such candidate file")
    if json_out is not None:
        check_writable(json_out, "--json")
    source = candidate.read_text()
    evaluator = evaluator_from(load_settings())
    try:
        with err_console.status("evaluating") as status:
            report = evaluate_candidate(loaded, source, target=target, size=size, filename=str(candidate),
                                        evaluator=evaluator, progress=lambda stage: status.update(f"evaluating: {stage}"))
    finally:
        evaluator.close()
    print_report(report)
    if json_out:
        json_out.write_text(report.model_dump_json(indent=2))
    raise typer.Exit(0 if report.correct else 1)


def print_report(report: Any) -> None:
    checks = Table(title=f"{report.task} · target {report.target} · {report.size} size")
    checks.add_column("check")
    checks.add_column("result")
    checks.add_column("detail", overflow="fold")
    for c in report.checks:
        checks.add_row(c.name, "[green]pass[/]" if c.passed else "[red]FAIL[/]", escape(c.detail))
    console.print(checks)
    colour = "green" if report.status == "ok" else "red"
    summary = Table(show_header=False)
    summary.add_column("field")
    summary.add_column("value", overflow="fold")
    summary.add_row("status", f"[{colour}]{report.status}[/]")
    if report.reason:
        summary.add_row("reason", escape(report.reason))  # a reason may hold brackets: `pip install -e ".[gpu]"`
    summary.add_row("label", str(report.label or "-"))
    summary.add_row("max abs err", _fmt_sci(report.max_abs_err))
    basis = f" ({report.basis})" if report.basis else ""
    summary.add_row("reference ms" + basis, _fmt_opt(report.ref_ms))
    summary.add_row("kernel ms" + basis, _fmt_opt(report.kernel_ms))
    summary.add_row("speedup", speedup_text(report.speedup, report.interval))
    summary.add_row("cv (kernel / ref)", f"{_fmt_opt(report.cv)} / {_fmt_opt(report.ref_cv)}")
    summary.add_row("FLOPs (ref / kernel)", f"{_fmt_sci(report.ref_flops)} / {_fmt_sci(report.kernel_flops)}")
    for flag in report.flags:
        summary.add_row("flag", f"[yellow]{escape(flag)}[/]")
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


@app.command("host")
@guarded
def host_cmd(address: str = typer.Argument(..., help="HOST:PORT to listen on, e.g. 0.0.0.0:50051")) -> None:
    """Run the gRPC host that actors on many machines connect to."""
    import asyncio

    from maxkernel.commands.checks import check_address, check_port_free

    host, port = check_address(address, "ADDRESS")
    check_port_free(host, port)
    from actors.host import serve

    try:
        asyncio.run(serve(address))
    except KeyboardInterrupt:
        pass


@app.command("worker")
@guarded
def worker_cmd(
    host: str = typer.Option(..., help="HOST:PORT of the gRPC host, e.g. 127.0.0.1:50051"),
    roles: str = typer.Option(..., help="comma-separated roles, e.g. tester or planner,coder"),
    config: Optional[Path] = typer.Option(None, help="ActorConfig as a YAML or JSON file"),
    supervise: bool = typer.Option(False, "--supervise", help="keep --count workers alive, replacing any that dies"),
    count: int = typer.Option(1, min=1, help="workers kept alive under --supervise"),
    spares: int = typer.Option(0, min=0, help="warm standby workers under --supervise, each taking a dead "
                                              "worker's place at once"),
) -> None:
    """Run actors on this machine against a gRPC host (with --supervise: a loop that keeps them alive)."""
    import asyncio

    from maxkernel.commands.checks import check_address
    from maxkernel.runtime import ROLES

    check_address(host, "--host")
    wanted = [r.strip() for r in roles.split(",") if r.strip()]
    unknown = [r for r in wanted if r not in ROLES]
    if not wanted or unknown:
        raise UserError(f"--roles {roles}: {'unknown role ' + unknown[0] if unknown else 'no role'}; "
                        f"choose from {', '.join(ROLES)}")
    if supervise:
        from actors.supervisor import Supervisor
        from maxkernel.logging import configure

        configure("info")
        worker_args = ["--host", host, "--roles", ",".join(wanted), *(["--config", str(config)] if config else [])]
        raise typer.Exit(Supervisor(worker_args, count, spares=spares).run())
    if count != 1 or spares:
        raise UserError("--count and --spares apply only with --supervise")
    from actors.config import ActorConfig
    from actors.worker import serve

    actor_config = ActorConfig.from_file(config) if config else ActorConfig()
    try:
        asyncio.run(serve(host, wanted, actor_config))
    except KeyboardInterrupt:
        pass


def _register_commands() -> None:
    """Commands whose modules import their heavy parts (rules, actors, orchestrators) only when run."""
    from maxkernel.commands.analyze import analyze_command
    from maxkernel.commands.chat import chat_command
    from maxkernel.commands.daemon import cancel_command, daemon_command, jobs_command, submit_command
    from maxkernel.commands.export import export_command
    from maxkernel.commands.extract import extract_command
    from maxkernel.commands.model import optimize_model_command
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
    app.command("export")(export_command)
    app.command("extract")(extract_command)
    app.command("optimize-model")(optimize_model_command)
    app.command("fleet")(fleet_command)


_register_commands()


def run() -> None:
    app()


if __name__ == "__main__":
    run()
