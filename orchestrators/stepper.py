"""One actor step at a time, for HITL: the chosen role on a fresh runtime, the next message captured.

Each step registers only the role that works (plus the recorder, and the tester and librarian without
topic subscriptions, so that an actor's tools can still judge a draft or recall memory by direct message),
publishes its input, and returns the first message the role publishes onward: that is what the person
approves, edits or rejects before anything else happens. LLM clients are kept per (session, role) by
``Services``, so a replay transcript continues across steps.
"""

from __future__ import annotations

import asyncio
from typing import Any

from autogen_core import ClosureAgent, ClosureContext, MessageContext, TypeSubscription

from actors.registry import ACTORS, topics_for
from actors.services import Services
from maxkernel.messages import BusMessage
from maxkernel.runtime import LIBRARIAN, RECORDER, TESTER, TOPICS, add_serializers, local_runtime, publish


async def step(services: Services, role: str, message: BusMessage, wanted: tuple[type, ...],
               timeout_s: float | None = 600) -> BusMessage:
    """Run ``role`` on ``message``; return the first published message of a ``wanted`` type."""
    runtime = local_runtime()
    add_serializers(runtime)
    for name in {role, RECORDER, TESTER, LIBRARIAN}:
        cls = ACTORS[name]
        if name == RECORDER:
            await cls.register(runtime, name, lambda cls=cls: cls(services))
        else:
            await cls.register(runtime, name, lambda cls=cls: cls(services), skip_class_subscriptions=True)
        if name in (role, RECORDER):
            for topic_type in topics_for(name):
                await runtime.add_subscription(TypeSubscription(topic_type, name))
    got: asyncio.Queue[BusMessage] = asyncio.Queue()

    async def capture(_ctx: ClosureContext, msg: Any, _mctx: MessageContext) -> None:
        if isinstance(msg, wanted):
            got.put_nowait(msg)

    await ClosureAgent.register_closure(runtime, "capture", capture, unknown_type_policy="ignore",
                                        subscriptions=lambda: [TypeSubscription(t, "capture") for t in TOPICS])
    runtime.start()
    try:
        await publish(runtime, message, role)
        return await asyncio.wait_for(got.get(), timeout_s)
    finally:
        await runtime.stop_when_idle()


async def record(services: Services, message: BusMessage) -> None:
    """Put a message in the event log (a person's prompt or decision) through the recorder."""
    runtime = local_runtime()
    add_serializers(runtime)
    await ACTORS[RECORDER].register(runtime, RECORDER, lambda: ACTORS[RECORDER](services))
    await runtime.add_subscription(TypeSubscription(RECORDER, RECORDER))
    runtime.start()
    await publish(runtime, message, RECORDER)
    await runtime.stop_when_idle()


async def ask_tester(services: Services, draft: Any, timing: bool) -> BusMessage:
    """The tester's judgement of ``draft`` by direct request (``EvalRequest``): with timing (test) or
    correctness only (validate). The answer comes back here, not to the debugger or the profiler."""
    from autogen_core import AgentId

    from maxkernel.messages import EvalRequest

    runtime = local_runtime()
    add_serializers(runtime)
    for name in (TESTER, RECORDER):
        cls = ACTORS[name]
        if name == RECORDER:
            await cls.register(runtime, name, lambda cls=cls: cls(services))
            for topic_type in topics_for(name):
                await runtime.add_subscription(TypeSubscription(topic_type, name))
        else:
            await cls.register(runtime, name, lambda cls=cls: cls(services), skip_class_subscriptions=True)
    runtime.start()
    try:
        request = EvalRequest(session_id=draft.session_id, task_id=draft.task_id, candidate_id=draft.candidate_id,
                              parent_id=draft.parent_id, draft=draft, timing=timing, sender="human")
        return await runtime.send_message(request, AgentId(TESTER, draft.session_id))
    finally:
        await runtime.stop_when_idle()
