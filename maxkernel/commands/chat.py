"""``maxkernel chat TASK [--resume ID]``: the HITL session in this terminal."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def chat_command(
    task: str = typer.Argument(..., help="suite id or task folder"),
    brain: str = typer.Option("rules", help="rules | gemini | openai | replay"),
    model: Optional[str] = typer.Option(None, help="model preset for an LLM brain"),
    transcript: Optional[Path] = typer.Option(None, help="replay: the transcript the replies come from"),
    target: str = typer.Option("cpu", help="cpu | gpu | tpu-v5e | ..."),
    resume: Optional[str] = typer.Option(None, help="resume the chat session with this id"),
    budget: Optional[float] = typer.Option(None, help="seconds the agents may work in this sitting (your own "
                                                      "time is not counted; default: no limit)"),
    evals: Optional[int] = typer.Option(None, help="evaluations the session may spend in all (default: no limit; "
                                                   "with --resume: the new limit)"),
) -> None:
    """Work on a kernel with the agents, approving, editing or rejecting each step."""
    from maxkernel.cli import guarded

    guarded(_chat)(task, brain, model, transcript, target, resume, budget, evals)


def _chat(task: str, brain: str, model: Optional[str], transcript: Optional[Path], target: str,
          resume: Optional[str], budget: Optional[float], evals: Optional[int]) -> None:
    import asyncio

    from actors.session import check_keys, config_for_brain
    from jaxbench.task import load_task
    from maxkernel.cli import UserError
    from maxkernel.commands.checks import check_limits, check_reference, check_target, resolve_resume
    from orchestrators.hitl import ChatLimits, run_chat

    check_limits(budget, evals)
    check_target(target)
    check_reference(load_task(task))
    try:
        config = config_for_brain(brain, model=model, transcript=transcript)
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    if brain == "replay" and transcript is None:
        raise UserError("--brain replay needs --transcript PATH")
    check_keys(config)
    if resume:
        resume = resolve_resume(resume, "session")
    asyncio.run(run_chat(task, config, resume=resume, target=target,
                         limits=ChatLimits(time_s=budget, max_evaluations=evals)))
