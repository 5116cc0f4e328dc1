"""``maxkernel search TASK... --algo parallel|beam|evolve``: a graph search, resumable with ``--resume``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, List, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from jaxbench.report import format_speedup

DEFAULT_EVALS = 30


def search_command(
    tasks: List[str] = typer.Argument(None, help="suite ids or task folders (several: batch mode)"),
    algo: str = typer.Option("beam", help="parallel | beam | evolve"),
    seed: int = typer.Option(0, help="seed of every random choice (same seed, same search)"),
    evals: Optional[int] = typer.Option(None, help=f"evaluations per task (default {DEFAULT_EVALS}; with --resume: "
                                                   "the search's new limit, default the stored one)"),
    budget: Optional[float] = typer.Option(None, help="seconds per task (default: no limit but the evaluations; "
                                                      "with --resume: the resumed run's)"),
    global_evals: Optional[int] = typer.Option(None, help="batch mode: evaluations for all tasks together"),
    suite: bool = typer.Option(False, help="search every task of the suite"),
    width: int = typer.Option(2, help="beam width"),
    branching: int = typer.Option(2, help="beam: children per node"),
    depth: int = typer.Option(3, help="beam depth"),
    lanes: int = typer.Option(2, help="parallel: independent lanes"),
    islands: int = typer.Option(2, help="evolve: islands"),
    brain: str = typer.Option("rules", help="rules | gemini | openai | replay"),
    transcript: Optional[Path] = typer.Option(None, help="replay: the transcript"),
    target: str = typer.Option("cpu", help="cpu | gpu | tpu-v5e | ..."),
    resume: Optional[str] = typer.Option(None, help="resume the search with this id (after a crash or kill)"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="write the results as JSON"),
) -> None:
    """Search a graph of candidates; the search is stored as it goes and resumes with --resume ID."""
    from maxkernel.cli import guarded

    guarded(_search)(tasks or [], algo, seed, evals, budget, global_evals, suite, width, branching, depth, lanes, islands,
                     brain, transcript, target, resume, json_out)


def _search(tasks: list[str], algo: str, seed: int, evals: Optional[int], budget: Optional[float], global_evals: Optional[int],
            suite: bool,
            width: int, branching: int, depth: int, lanes: int, islands: int, brain: str,
            transcript: Optional[Path], target: str, resume: Optional[str], json_out: Optional[Path]) -> None:
    from actors.session import check_keys, config_for_brain
    from jaxbench.task import list_tasks, load_task
    from maxkernel.cli import UserError
    from maxkernel.commands.checks import check_at_least, check_limits, check_reference, check_store, check_target, check_writable, resolve_resume
    from orchestrators.interrupt import run_interruptible
    from orchestrators.search import DECIDERS, SearchConfig, SearchLimits, run_search, run_suite

    if algo not in DECIDERS:
        raise UserError(f"--algo {algo}: choose parallel, beam or evolve")
    check_limits(budget, evals)
    check_limits(None, global_evals, "--global-evals")
    for flag, value in (("--width", width), ("--branching", branching), ("--depth", depth), ("--lanes", lanes),
                        ("--islands", islands)):
        check_at_least(value, flag, 1)
    check_target(target)
    if json_out is not None:
        check_writable(json_out, "--json")
    if suite:
        tasks = [t.id for t in list_tasks()]
    if not tasks:
        raise UserError("name a task (or several), or pass --suite")
    if resume and len(tasks) != 1:
        raise UserError("--resume continues one search: name its one task")
    if resume:
        resume = resolve_resume(resume, "search")
    if brain == "replay" and transcript is None:
        raise UserError("--brain replay needs --transcript PATH")
    for t in tasks:
        check_reference(load_task(t))  # a bad name or reference fails here, in one line; a folder goes on as its path
    if resume:
        _check_resumed_task(resume, load_task(tasks[0]).id)
    loaded = list(tasks)
    try:
        config_actor = config_for_brain(brain, transcript=transcript)
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    check_keys(config_actor)
    check_store()
    config = SearchConfig(algorithm=algo, seed=seed, target=target,  # type: ignore[arg-type]
                          max_evaluations=evals or DEFAULT_EVALS, time_s=budget, width=width, branching=branching, depth=depth, lanes=lanes, islands=islands)
    err = Console(stderr=True)
    with _progress(err) as (progress, on_event):
        if len(loaded) == 1:
            limits = SearchLimits(max_evaluations=evals, time_s=budget)  # a resume runs on to the limits given
            results = [run_interruptible(run_search(loaded[0], config, config_actor, search_id=resume, limits=limits,
                                                    on_event=on_event))]
        else:
            results = run_interruptible(run_suite(loaded, config, config_actor, global_evaluations=global_evals,
                                                  on_event=on_event)).results
    table = results_table(results, algo, seed)
    Console().print(table)
    if json_out:
        json_out.write_text(json.dumps([r.model_dump(mode="json") for r in results], indent=2))
    raise typer.Exit(0 if all(r.status == "scored" for r in results) else 1)


def _check_resumed_task(search_id: str, task_id: str) -> None:
    """A search resumes only as the search of its own task: said before anything starts."""
    from maxkernel.cli import UserError
    from maxkernel.config import load_settings
    from memory import Store
    from orchestrators.search import stored_task_id

    with Store.open(load_settings().resolved_store_url) as store:
        stored = stored_task_id(store, search_id)
    if stored != task_id:
        raise UserError(f"--resume {search_id[:12]}: a search of {stored}, not of {task_id}")


def results_table(results: list[Any], algo: str, seed: int) -> Table:
    """One row per search; nothing a user copies (the id, the strategy, its params) is ever cut."""
    table = Table(title=f"{algo} search · seed {seed}")
    for col in ("search", "task"):  # ids are copied into other commands: whole, on one line
        table.add_column(col, no_wrap=True)
    for col in ("evals", "speedup", "best"):
        # folded, never cut: the strategy and its params are copied; the speedup's words
        # ("confirmed", its interval) are never split
        table.add_column(col, overflow="fold", min_width=len("confirmed") if col == "speedup" else None)
    for r in results:
        speed = (format_speedup(r.best_speedup, r.best_speedup_ci) + f" {r.claim}"
                 + (" confirmed" if r.confirmed else "")
                 + (f"; the reference as a candidate {format_speedup(r.baseline_speedup, r.baseline_speedup_ci)}"
                    if r.baseline_speedup else "")
                 ) if r.best_speedup else "-"
        evals = f"{r.evaluations}" + (f" (first correct: {r.first_correct_at})" if r.first_correct_at else "")
        best = " ".join(x for x in (r.best_strategy, str(r.best_params) if r.best_params else "") if x) or "-"
        table.add_row(r.search_id[:12], escape(r.task_id), evals, speed, escape(best))
    return table


class _progress:
    """A rich progress line per search, fed by the search's events."""

    def __init__(self, console: Console) -> None:
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                                 console=console, transient=False)
        self.bar: Any = None

    def __enter__(self) -> tuple[Any, Any]:
        self.progress.__enter__()
        self.bar = self.progress.add_task("planning", total=None)

        def on_event(kind: str, data: dict[str, Any]) -> None:
            if kind == "task":
                self.progress.update(self.bar, description=f"{data['task']}: planning")
            elif kind == "round":
                self.progress.update(self.bar, description=f"round {data['round']}: {data['expansions']} expansions")
            elif kind == "expansion":
                self.progress.console.print(f"  #{data['n']} {data['edge']} {data['params'] or ''}", markup=False,
                                            highlight=False)

        return self.progress, on_event

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(*exc)  # type: ignore[arg-type]
