"""The actor bus: topics, the local runtime, and the gRPC host and workers for many machines.

Every actor role listens on a topic type named after the role; the topic source is the session id, so
one runtime carries many sessions side by side. The same registration code runs on
``SingleThreadedAgentRuntime`` (one process) and on ``GrpcWorkerAgentRuntime`` (a worker connected to a
``GrpcWorkerAgentRuntimeHost``); only the runtime object changes.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from autogen_core import (
    AgentRuntime,
    BaseAgent,
    ClosureAgent,
    ClosureContext,
    MessageContext,
    SingleThreadedAgentRuntime,
    TopicId,
    TypeSubscription,
    try_get_known_serializers_for_type,
)

from maxkernel.messages import ALL_MESSAGES, BusMessage, SessionFinished

PLANNER = "planner"
CODER = "coder"
TESTER = "tester"
DEBUGGER = "debugger"
PROFILER = "profiler"
TUNER = "tuner"
LIBRARIAN = "librarian"
RECORDER = "recorder"
SESSION = "session"

ROLES: tuple[str, ...] = (PLANNER, CODER, TESTER, DEBUGGER, PROFILER, TUNER, LIBRARIAN, RECORDER)
TOPICS: tuple[str, ...] = (PLANNER, CODER, TESTER, DEBUGGER, PROFILER, TUNER, LIBRARIAN, SESSION)


def topic(role: str, session_id: str) -> TopicId:
    return TopicId(type=role, source=session_id)


def add_serializers(runtime: Any) -> None:
    """Register a JSON serializer for every bus message (the gRPC runtime needs one per type)."""
    for cls in ALL_MESSAGES:
        runtime.add_message_serializer(try_get_known_serializers_for_type(cls))


def local_runtime() -> SingleThreadedAgentRuntime:
    return SingleThreadedAgentRuntime()


def start_host(address: str) -> Any:
    """Start a gRPC host (the router that workers connect to) on ``address`` such as ``127.0.0.1:50051``."""
    from autogen_ext.runtimes.grpc import GrpcWorkerAgentRuntimeHost

    host = GrpcWorkerAgentRuntimeHost(address=address)
    host.start()
    return host


async def connect_worker(address: str, token: str | None = None) -> Any:
    """A started gRPC worker runtime connected to the host at ``address``, with every serializer added;
    it presents ``token`` (by default the settings' token) to a host that requires one."""
    from autogen_ext.runtimes.grpc import GrpcWorkerAgentRuntime

    from maxkernel.auth import HostUnreachable, channel_options

    if token is None:
        from maxkernel.config import load_settings

        token = load_settings().token
    import grpc

    worker = GrpcWorkerAgentRuntime(host_address=address, extra_grpc_config=channel_options(token) or None)
    add_serializers(worker)
    try:
        await worker.start()
    except grpc.aio.AioRpcError as exc:
        if exc.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAUTHENTICATED,
                              grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.DEADLINE_EXCEEDED):
            raise
        reason = "refused the token" if exc.code() in (grpc.StatusCode.UNAUTHENTICATED,
                                                        grpc.StatusCode.PERMISSION_DENIED) else "cannot be reached"
        raise HostUnreachable(f"gRPC host {address} {reason} ({exc.details()}); is `maxkernel host` running there?") \
            from None
    return worker


class SessionWaiter:
    """Collects the ``SessionFinished`` of each session from the session topic."""

    def __init__(self) -> None:
        self._futures: dict[str, asyncio.Future[SessionFinished]] = {}

    def _future(self, session_id: str) -> asyncio.Future[SessionFinished]:
        if session_id not in self._futures:
            self._futures[session_id] = asyncio.get_running_loop().create_future()
        return self._futures[session_id]

    async def register(self, runtime: AgentRuntime, agent_type: str = "session_waiter") -> None:
        async def on_message(_ctx: ClosureContext, message: SessionFinished, _mctx: MessageContext) -> None:
            future = self._future(message.session_id)
            if not future.done():
                future.set_result(message)

        await ClosureAgent.register_closure(
            runtime, agent_type, on_message, subscriptions=lambda: [TypeSubscription(SESSION, agent_type)]
        )

    async def wait(self, session_id: str, timeout_s: float | None = None) -> SessionFinished:
        return await asyncio.wait_for(asyncio.shield(self._future(session_id)), timeout_s)


class _Watcher(BaseAgent):
    def __init__(self, on_message: Callable[[BusMessage], None]) -> None:
        super().__init__("calls back on every bus message")
        self._on_message = on_message

    async def on_message_impl(self, message: Any, ctx: MessageContext) -> Any:
        if isinstance(message, BusMessage):
            self._on_message(message)
        return None


async def watch(runtime: AgentRuntime, on_message: Callable[[BusMessage], None], agent_type: str = "session_watcher") -> None:
    """Call ``on_message`` with every message on every topic (progress displays, live views)."""
    await _Watcher.register(runtime, agent_type, lambda: _Watcher(on_message))
    for topic_type in (*TOPICS, RECORDER):
        await runtime.add_subscription(TypeSubscription(topic_type, agent_type))


async def publish(runtime: AgentRuntime, message: BusMessage, role: str) -> None:
    """Publish from outside any actor (an orchestrator starting a session)."""
    await runtime.publish_message(message, topic(role, message.session_id))
