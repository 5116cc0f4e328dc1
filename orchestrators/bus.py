"""The bus an orchestrator drives: the actors on a local runtime, plus an observer of every message.

Two runtimes share one ``Services``: the *work* runtime holds every role but the planner, so that an
orchestrator decides which plan (and which step of it) the coder works on; the *planning* runtime holds
the planner and the librarian it recalls from, and a capture agent sits where the coder would, so a plan
stops there and comes back to the orchestrator. Both runtimes carry a recorder: every message lands in
the event log either way.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any, Callable

import structlog
from autogen_core import AgentId, ClosureAgent, ClosureContext, MessageContext, SingleThreadedAgentRuntime, TypeSubscription

from actors.registry import register_actors
from actors.services import Services
from maxkernel.messages import (
    BusMessage,
    EvalReport,
    EvalRequest,
    FixRequest,
    KernelDraft,
    OptimizeRequest,
    Plan,
    SessionFinished,
    StrategyRef,
    new_id,
)
from maxkernel.runtime import CODER, LIBRARIAN, PLANNER, RECORDER, ROLES, SESSION, TESTER, TOPICS, local_runtime, publish

log = structlog.get_logger("orchestrators.bus")

WORK_ROLES = tuple(r for r in ROLES if r != PLANNER)
PLAN_ROLES = (PLANNER, LIBRARIAN, RECORDER)


def is_evaluation(message: BusMessage) -> bool:
    """Every judge call ends in exactly one EvalReport or FixRequest (routed, or copied to the recorder)."""
    return isinstance(message, (EvalReport, FixRequest))


class SessionLog:
    """What the observer saw of one session, in bus order, and its finish signals."""

    def __init__(self) -> None:
        self.messages: list[BusMessage] = []
        self.finished: asyncio.Queue[SessionFinished] = asyncio.Queue()
        self.plans: asyncio.Queue[Plan] = asyncio.Queue()

    @property
    def evaluations(self) -> int:
        return sum(1 for m in self.messages if is_evaluation(m))

    def since(self, index: int) -> list[BusMessage]:
        return self.messages[index:]


class Bus:
    """Owns the two runtimes for as long as an orchestrator runs; ``async with Bus(services) as bus``."""

    def __init__(self, services: Services, on_message: Callable[[BusMessage], None] | None = None) -> None:
        self.services = services
        self.on_message = on_message
        self.logs: dict[str, SessionLog] = defaultdict(SessionLog)
        self.work: SingleThreadedAgentRuntime | None = None
        self.planning: SingleThreadedAgentRuntime | None = None

    async def __aenter__(self) -> "Bus":
        self.work = local_runtime()
        await register_actors(self.work, self.services, WORK_ROLES)
        await self._observe(self.work, TOPICS + (RECORDER,))
        self.planning = local_runtime()
        await register_actors(self.planning, self.services, PLAN_ROLES)
        await self._observe(self.planning, (CODER, SESSION))
        self.work.start()
        self.planning.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close(idle=exc[0] is None)

    async def close(self, idle: bool = True) -> None:
        """Stop both runtimes: after the queued work drains (``idle``), or at once (an interrupted run)."""
        for runtime in (self.planning, self.work):
            if runtime is None:
                continue
            try:
                if idle:
                    await runtime.stop_when_idle()
                else:
                    await runtime.stop()
            except RuntimeError:  # already stopped
                pass
        self.planning = self.work = None

    async def _observe(self, runtime: SingleThreadedAgentRuntime, topics: tuple[str, ...]) -> None:
        async def on_message(_ctx: ClosureContext, message: Any, _mctx: MessageContext) -> None:
            if not isinstance(message, BusMessage):
                return
            record = self.logs[message.session_id]
            record.messages.append(message)
            if self.on_message is not None:
                self.on_message(message)
            if isinstance(message, SessionFinished):
                record.finished.put_nowait(message)
            elif isinstance(message, Plan) and runtime is self.planning:
                record.plans.put_nowait(message)

        await ClosureAgent.register_closure(
            runtime, "observer", on_message, unknown_type_policy="ignore",
            subscriptions=lambda: [TypeSubscription(t, "observer") for t in topics])

    def log(self, session_id: str) -> SessionLog:
        return self.logs[session_id]

    async def plan(self, request: OptimizeRequest, timeout_s: float | None = None) -> Plan | SessionFinished:
        """Ask the planner (it recalls from memory first); the plan comes back instead of going to the coder."""
        assert self.planning is not None, "the bus is not open"
        record = self.log(request.session_id)
        request.sender = request.sender or "orchestrator"
        await publish(self.planning, request, PLANNER)
        plan_wait = asyncio.ensure_future(record.plans.get())
        fail_wait = asyncio.ensure_future(record.finished.get())
        done, pending = await asyncio.wait({plan_wait, fail_wait}, timeout=timeout_s,
                                           return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        if not done:
            raise asyncio.TimeoutError
        return (plan_wait if plan_wait in done else fail_wait).result()

    async def run_plan(self, plan: Plan, timeout_s: float | None = None) -> SessionFinished:
        """Hand a plan to the coder and wait until the pipeline ends (scored, failed, budget or error)."""
        assert self.work is not None, "the bus is not open"
        plan.sender = "orchestrator"
        await publish(self.work, plan, CODER)
        return await asyncio.wait_for(self.log(plan.session_id).finished.get(), timeout_s)

    async def evaluate(self, draft: KernelDraft, timing: bool = True) -> EvalReport:
        """Have the tester judge ``draft`` directly (a baseline or confirmation run): the draft is recorded
        as a candidate first, and the tester copies its report to the event log."""
        assert self.work is not None, "the bus is not open"
        draft.sender = draft.sender or "orchestrator"
        await publish(self.work, draft, RECORDER)
        request = EvalRequest(session_id=draft.session_id, task_id=draft.task_id, candidate_id=draft.candidate_id,
                              parent_id=draft.parent_id, draft=draft, timing=timing, sender=draft.sender)
        reply = await self.work.send_message(request, AgentId(TESTER, draft.session_id))
        if not isinstance(reply, EvalReport):
            raise RuntimeError(f"the tester gave no report for {draft.produced_by or 'a draft'} (it failed; see the event log)")
        return reply

    async def judge(self, session_id: str, task_id: str, source: str, ref: StrategyRef, produced_by: str, *,
                    target: str, size: str, candidate_id: str | None = None) -> EvalReport:
        """Judge ``source`` outside the pipeline as a draft of ``ref`` (the baseline, or a confirmation run of
        the candidate ``candidate_id``)."""
        plan = Plan(session_id=session_id, task_id=task_id, target=target, size=size, strategies=[ref],
                    sender="orchestrator")
        draft = KernelDraft(session_id=session_id, task_id=task_id, candidate_id=candidate_id or new_id(), plan=plan,
                            source=source, produced_by=produced_by, sender="orchestrator")
        return await self.evaluate(draft)

    async def send(self, message: BusMessage, role: str) -> None:
        """Publish any message on the work runtime (HITL steps)."""
        assert self.work is not None, "the bus is not open"
        await publish(self.work, message, role)
