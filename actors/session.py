"""One optimization session through the actors, on the local runtime.

``run_session`` runs one plan through the pipeline once (the building block; an optimization with a budget
is an Auto session, ``orchestrators.api.optimize``); ``prepare_brain`` turns a brain name (rules, gemini,
openai, replay) into a checked actor config.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Callable

import structlog
from pydantic import BaseModel

from actors.config import ActorConfig
from actors.registry import register_actors
from actors.services import Services
from jaxbench.report import EvalReport as JudgeReport
from maxkernel.messages import Budget, BusMessage, OptimizeRequest, SessionFinished, new_id
from maxkernel.runtime import PLANNER, SessionWaiter, local_runtime, publish, watch

log = structlog.get_logger("actors.session")

BRAINS = ("rules", "gemini", "openai", "replay")


class SessionResult(BaseModel):
    session_id: str
    task_id: str
    status: str
    reason: str = ""
    source: str | None = None
    report: JudgeReport | None = None
    strategy: str = ""
    tokens: int = 0
    cost_usd: float = 0.0


def config_for_brain(brain: str, *, model: str | None = None, base_url: str | None = None,
                     transcript: Path | None = None, record_to: Path | None = None) -> ActorConfig:
    """The actor config a CLI ``--brain`` names: rules, or the LLM brain on a provider's preset."""
    if brain not in BRAINS:
        raise ValueError(f"unknown brain {brain!r}: choose one of {', '.join(BRAINS)}")
    if brain == "rules":
        return ActorConfig(brain="rules")
    from maxkernel.llm.presets import models

    default = {"gemini": models().default, "openai": "openai", "replay": "replay"}[brain]
    return ActorConfig(brain="llm", model=model or default, base_url=base_url, transcript=transcript,
                       record_to=record_to)


def check_keys(config: ActorConfig) -> None:
    """Fail before anything starts when an LLM role has no API key (MissingApiKeyError: one line)."""
    from actors.config import BRAIN_ROLES
    from maxkernel.llm.factory import api_key
    from maxkernel.llm.presets import models

    for role in BRAIN_ROLES:
        if config.brain_for(role) == "llm":
            preset = models().preset(config.model_for(role))
            if preset.provider != "replay":
                api_key(preset)


async def run_session(task_id: str, config: ActorConfig | None = None, *, target: str = "cpu", size: str = "cpu",
                      budget: Budget | None = None, services: Services | None = None, session_id: str | None = None,
                      timeout_s: float | None = None, on_message: Callable[[BusMessage], None] | None = None
                      ) -> SessionResult:
    """Run one session to its end; ``on_message`` sees every bus message (for a progress display)."""
    from maxkernel.targets.names import parse_target

    config = config or ActorConfig()
    budget = budget or Budget()
    parse_target(target)  # a bad target or task name fails here (one line), before anything starts
    own = services is None
    services = services or Services(config)
    session_id = session_id or new_id()
    task = services.task(task_id)
    brain = config.brain if config.brain == "rules" else f"llm:{config.model}"
    try:
        services.store.create_session(mode="auto", brain=brain, target=target, budget=budget.model_dump(),
                                      task_id=task.id, id=session_id)
    except BaseException:
        if own:
            await services.aclose()
        raise
    runtime = local_runtime()
    waiter = SessionWaiter()
    finished: SessionFinished | None = None
    try:
        await register_actors(runtime, services)
        await waiter.register(runtime)
        if on_message is not None:
            await watch(runtime, on_message)
        runtime.start()
        await publish(runtime, OptimizeRequest(session_id=session_id, task_id=task.id, target=target, size=size,
                                               brain=brain, budget=budget, sender="session"), PLANNER)
        try:
            finished = await waiter.wait(session_id, timeout_s)
            await runtime.stop_when_idle()
        except asyncio.TimeoutError:
            finished = SessionFinished(session_id=session_id, task_id=task.id, status="error",
                                       reason=f"session timed out after {timeout_s} s")
            await runtime.stop()
    finally:
        services.store.set_session_status(session_id, finished.status if finished else "error")
        ledger = services.ledger(session_id, budget)
        if own:
            await services.aclose()
    best = finished.best
    log.info("session.finished", session=session_id, task=task.id, status=finished.status, reason=finished.reason)
    return SessionResult(session_id=session_id, task_id=task.id, status=finished.status, reason=finished.reason,
                         source=best.source if best else None, report=best.report if best else None,
                         strategy=best.strategy if best else "", tokens=ledger.tokens, cost_usd=round(ledger.cost_usd, 6))


def prepare_brain(brain: str, *, model: str | None = None, base_url: str | None = None,
                  transcript: Path | None = None, record_to: Path | None = None,
                  data_dir: str | None = None) -> ActorConfig:
    """The config of a named brain, checked before anything starts: raises ValueError (unknown brain),
    MissingApiKeyError or TranscriptError, each one line."""
    config = config_for_brain(brain, model=model, base_url=base_url, transcript=transcript, record_to=record_to)
    if data_dir:
        config = config.model_copy(update={"data_dir": data_dir})
    check_keys(config)
    if brain == "replay":
        from maxkernel.llm.errors import TranscriptError
        from maxkernel.llm.transcript import read_transcript

        if transcript is None:
            raise TranscriptError("replay: no transcript file given (--transcript PATH); or run with --brain rules")
        read_transcript(Path(transcript))
    return config
