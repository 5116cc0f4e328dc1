"""The base of every actor: publishing with ids filled in, and crash handling.

A handler that raises is not allowed to lose its message: the actor's brain is rebuilt (a restart) and
the same message is handed to it again, up to ``max_restarts`` times; after that the failure is reported
on the bus (``ActorFailed``) and the session ends with status ``error`` naming the actor and the error.
A spent budget ends the session with status ``budget``.
"""

from __future__ import annotations

import traceback
from typing import Any, Awaitable, Callable

import structlog
from autogen_core import MessageContext, RoutedAgent

from actors.services import Services
from maxkernel.llm.errors import BudgetExceeded, MissingApiKeyError, TranscriptError
from maxkernel.messages import ActorFailed, ActorRestarted, Budget, BusMessage, SessionFinished, TokenUsage
from maxkernel.runtime import RECORDER, SESSION, topic

log = structlog.get_logger("actors")


class Actor(RoutedAgent):
    role: str = ""

    def __init__(self, services: Services, description: str = "") -> None:
        super().__init__(description or self.role)
        self.services = services
        self.restarts = 0

    # -- the brain's lifetime ---------------------------------------------------------------------

    def reset(self) -> None:
        """Drop whatever per-session state the actor holds (its brain); called on a restart."""

    # -- publishing -------------------------------------------------------------------------------

    async def send(self, message: BusMessage, role: str) -> None:
        message.sender = self.role
        await self.publish_message(message, topic(role, message.session_id))

    async def flush_usage(self, about: BusMessage, budget: Budget) -> None:
        """Publish the token usage the brain's model calls booked (to the recorder)."""
        ledger = self.services.ledger(about.session_id, budget)
        for record in ledger.drain(self.role):
            await self.send(TokenUsage(
                session_id=about.session_id, task_id=about.task_id, candidate_id=about.candidate_id,
                actor=record.actor, model=record.model, prompt_tokens=record.prompt_tokens,
                completion_tokens=record.completion_tokens, cost_usd=round(record.cost_usd, 8),
                session_tokens=record.session_tokens, session_cost_usd=round(record.session_cost_usd, 8)), RECORDER)

    async def finish(self, about: BusMessage, status: str, reason: str, **extra: Any) -> None:
        await self.send(SessionFinished(session_id=about.session_id, task_id=about.task_id,
                                        candidate_id=about.candidate_id, status=status, reason=reason,  # type: ignore[arg-type]
                                        **extra), SESSION)

    # -- crash handling ---------------------------------------------------------------------------

    async def guarded(self, message: BusMessage, ctx: MessageContext, budget: Budget,
                      work: Callable[[], Awaitable[Any]]) -> Any:
        """Run ``work`` for ``message``; restart and re-deliver on a crash, report when restarts run out."""
        while True:
            try:
                result = await work()
                await self.flush_usage(message, budget)
                return result
            except BudgetExceeded as exc:
                await self.flush_usage(message, budget)
                log.info("actor.budget_spent", actor=self.role, session=message.session_id, reason=str(exc))
                await self.finish(message, "budget", str(exc))
                return None
            except (MissingApiKeyError, TranscriptError) as exc:
                # A setup error: restarting cannot help. One line, to the session.
                await self.flush_usage(message, budget)
                await self.finish(message, "error", str(exc))
                return None
            except Exception as exc:
                await self.flush_usage(message, budget)
                error = f"{type(exc).__name__}: {exc}"
                if self.restarts < self.services.config.max_restarts:
                    self.restarts += 1
                    log.warning("actor.restarted", actor=self.role, session=message.session_id, error=error,
                                restarts=self.restarts)
                    self.reset()
                    await self.send(ActorRestarted(session_id=message.session_id, task_id=message.task_id,
                                                   candidate_id=message.candidate_id, actor=self.role,
                                                   error=error[:2000], redelivered=type(message).__name__), RECORDER)
                    continue
                log.error("actor.failed", actor=self.role, session=message.session_id, error=error,
                          trace=traceback.format_exc()[-2000:])
                await self.send(ActorFailed(session_id=message.session_id, task_id=message.task_id,
                                            candidate_id=message.candidate_id, actor=self.role, error=error[:2000],
                                            message_type=type(message).__name__,
                                            message=message.model_dump(mode="json")), RECORDER)
                await self.finish(message, "error", f"{self.role} failed on {type(message).__name__}: {error[:500]}")
                return None
