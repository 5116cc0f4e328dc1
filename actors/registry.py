"""Putting actors on a runtime: which topics each role listens to."""

from __future__ import annotations

from typing import Any, Iterable

from autogen_core import TypeSubscription

from actors.coder import Coder
from actors.debugger import Debugger
from actors.librarian import Librarian
from actors.planner import Planner
from actors.profiler import Profiler
from actors.recorder import Recorder
from actors.services import Services
from actors.tester import Tester
from actors.tuner import Tuner
from maxkernel.runtime import RECORDER, ROLES, TOPICS, add_serializers

ACTORS: dict[str, type] = {
    "planner": Planner, "coder": Coder, "tester": Tester, "debugger": Debugger, "profiler": Profiler,
    "tuner": Tuner, "librarian": Librarian, "recorder": Recorder,
}


def topics_for(role: str) -> tuple[str, ...]:
    """A role hears its own topic; the recorder hears every topic, plus its own for records-only messages."""
    return TOPICS + (RECORDER,) if role == RECORDER else (role,)


async def register_actors(runtime: Any, services: Services, roles: Iterable[str] = ROLES) -> list[str]:
    """Register ``roles`` (default: all) on ``runtime``; one actor instance per role and session."""
    add_serializers(runtime)
    registered = []
    for role in roles:
        cls = services.actor_classes.get(role, ACTORS[role])
        if role == RECORDER:
            await cls.register(runtime, role, lambda cls=cls: cls(services))
        else:
            await cls.register(runtime, role, lambda cls=cls: cls(services), skip_class_subscriptions=True)
        for topic_type in topics_for(role):
            await runtime.add_subscription(TypeSubscription(topic_type, role))
        registered.append(role)
    return registered
