"""The command functions as the CLI registers them: queueing without a daemon, cancelling, and the one-line
errors a user can cause. No evaluation runs here."""

from __future__ import annotations

import json

import typer
from typer.testing import CliRunner

from maxkernel.commands.chat import chat_command
from maxkernel.commands.daemon import cancel_command, daemon_command, jobs_command, submit_command
from maxkernel.commands.report import report_command
from maxkernel.commands.search import search_command


def _app() -> typer.Typer:
    from maxkernel.logging import configure

    configure("warning")  # what the real CLI's callback does before any command
    app = typer.Typer()
    for name, fn in {"chat": chat_command, "daemon": daemon_command, "submit": submit_command, "jobs": jobs_command,
                     "cancel": cancel_command, "report": report_command, "search": search_command}.items():
        app.command(name)(fn)
    return app


def test_queue_from_the_shell_and_user_errors() -> None:
    runner, app = CliRunner(), _app()
    first = runner.invoke(app, ["submit", "12p_RMSNorm", "--priority", "3", "--evals", "5"])
    assert first.exit_code == 0, first.output
    job_id = first.output.strip()
    second = runner.invoke(app, ["submit", "41k_Gemm_Add_ReLU"])
    listed = json.loads(runner.invoke(app, ["jobs", "--json", "-"]).output)
    assert [j["task_id"] for j in listed] == ["41k_Gemm_Add_ReLU", "12p_RMSNorm"]
    assert listed[1]["priority"] == 3 and listed[1]["budget"]["max_evaluations"] == 5
    assert all(j["status"] == "queued" for j in listed)

    cancelled = runner.invoke(app, ["cancel", job_id[:10]])
    assert cancelled.exit_code == 0 and "cancelled" in cancelled.output
    assert json.loads(runner.invoke(app, ["jobs", "--json", "-", "--status", "cancelled"]).output)[0]["id"] == job_id

    status = runner.invoke(app, ["daemon", "status"])
    assert status.exit_code == 1 and "no daemon running" in status.output and "queued 1" in status.output
    for args, words in ((["submit", "no_such_task"], "no_such_task"), (["cancel", "ffffffff"], "no job"),
                        (["daemon", "restart"], "choose start, stop or status"), (["daemon", "stop"], "no daemon"),
                        (["report", "0123abcd"], "no job, search or session"),
                        (["search", "12p_RMSNorm", "--algo", "greedy"], "choose parallel, beam or evolve"),
                        (["search", "12p_RMSNorm", "--brain", "replay"], "transcript"),
                        (["search", "12p_RMSNorm", "--resume", "abcd"], "no search with id"),
                        (["chat", "12p_RMSNorm", "--brain", "replay"], "--transcript"),
                        (["submit", "12p_RMSNorm", "--brain", "replay"], "rules, gemini or openai")):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert words in result.output and len(result.output.strip().splitlines()) == 1, (args, result.output)
    assert second.exit_code == 0


def test_submit_and_chat_take_a_task_folder(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A folder is queued by its path (the daemon loads it from there) and a chat works on it by its id."""
    import asyncio
    import shutil

    from actors.config import ActorConfig
    from jaxbench.task import load_task
    from orchestrators.hitl import run_chat

    folder = tmp_path / "my_norm"
    shutil.copytree(load_task("12p_RMSNorm").path, folder)
    runner, app = CliRunner(), _app()
    queued = runner.invoke(app, ["submit", str(folder)])
    assert queued.exit_code == 0, queued.output
    assert json.loads(runner.invoke(app, ["jobs", "--json", "-"]).output)[0]["task_id"] == str(folder.resolve())

    lines = iter(["plan", "a", "quit"])
    said: list[str] = []
    asyncio.run(run_chat(str(folder), ActorConfig(brain="rules"), read=lambda _p: next(lines), write=said.append))
    out = "\n".join(said)
    assert "on 12p_RMSNorm (rules brain)" in out and "1. template:rowblock" in out
    assert f"resume with: maxkernel chat {folder.resolve()} --resume" in out  # the folder, not the suite task
