"""The gRPC host's router: several workers per role, the load spread over them, work of a dead one re-run.

AutoGen's host lets one worker hold an agent type. Here any number may: each request or event for a
balanced role (the tester) goes to the live worker of that role with the least work in flight; a tester
is given one request at a time, and the rest wait here, first come first served, so that no worker
idles while work waits behind a busy one. What a worker was given stays in flight until it answers (an
RPC response, or the report it publishes for an event); when the worker's connection drops, its
in-flight work goes, ahead of the waiting work, to another worker of the role, or waits for one to
register (a spare promoted, or a supervisor restarting the dead one). A worker that already published the
report of a request before it died is not asked again: the host answers the caller with that report, so
an evaluation is never judged twice in the record. Every caller numbers its requests from one, so a
request is passed on under an id of the host's own (two daemons' request 6 to one tester are two
requests) and its answer goes back under the caller's id. A verdict whose caller died before it came (a
daemon killed while its job's draft was being judged) is kept for a while: when the same draft of the same
task is asked judged again (the job carried on by another daemon), that verdict is the answer; asked
again while that judgement is still under way or waiting, the new caller adopts it and gets its verdict
when it comes, so the code is judged once however many daemons died waiting for it.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import structlog
from autogen_core import TopicId
from autogen_ext.runtimes.grpc import _constants
from autogen_ext.runtimes.grpc._worker_runtime_host_servicer import (
    GrpcWorkerAgentRuntimeHostServicer,
    get_client_id_or_abort,
)
from autogen_ext.runtimes.grpc._utils import subscription_from_proto
from autogen_ext.runtimes.grpc.protos import agent_worker_pb2, cloudevent_pb2

from maxkernel.runtime import TESTER

log = structlog.get_logger("actors.balancer")

# What a worker publishes when it is done with a piece of work (the names the serializers give them).
DONE_TYPES = frozenset({"EvalReport", "FixRequest", "SessionFinished"})
PER_WORKER = 1  # requests a balanced worker is given at once (its evaluator judges one at a time)
ORPHAN_TTL_S = 600.0  # how long a verdict whose caller died is kept for the one who asks again
ORPHANS_KEPT = 256


def judgement_key(payload: agent_worker_pb2.Payload) -> str | None:
    """What an evaluation request asks judged (task, code, target, size, timing), or None for any other."""
    if not payload.data_type.endswith("EvalRequest"):
        return None
    try:
        body = json.loads(payload.data)
    except ValueError:
        return None
    draft = body.get("draft") or {}
    plan = draft.get("plan") or {}
    what = [draft.get("task_id"), draft.get("source"), plan.get("target"), plan.get("size"), body.get("timing", True)]
    return hashlib.sha256(json.dumps(what).encode()).hexdigest()


def readdressed(kept: agent_worker_pb2.RpcResponse, request: agent_worker_pb2.RpcRequest) -> agent_worker_pb2.RpcResponse:
    """A kept verdict as the answer to ``request``: its report, with the ids and draft of the new request."""
    from maxkernel.messages import new_id

    body, asked = json.loads(kept.payload.data), json.loads(request.payload.data)
    body |= {k: asked.get(k) for k in ("session_id", "task_id", "candidate_id", "parent_id")}
    body |= {"draft": asked.get("draft"), "message_id": new_id()}
    return agent_worker_pb2.RpcResponse(
        request_id=request.request_id,
        payload=agent_worker_pb2.Payload(data_type=kept.payload.data_type,
                                         data_content_type=kept.payload.data_content_type,
                                         data=json.dumps(body).encode()))


@dataclass
class Delivery:
    """One piece of work given to a worker and not yet answered."""

    kind: Literal["request", "event"]
    agent_type: str
    source: str
    request: agent_worker_pb2.RpcRequest | None = None
    event: cloudevent_pb2.CloudEvent | None = None
    origin: str | None = None  # the client waiting for the response of a request
    wire_id: str = ""  # the id the request was passed on under (unique to this host)
    reported: cloudevent_pb2.CloudEvent | None = None  # the report the worker published before answering
    tries: int = 0
    future: asyncio.Future[Any] | None = field(default=None, repr=False)
    key: str | None = None  # what a request asks judged (``judgement_key``)
    adopters: list[tuple[agent_worker_pb2.RpcRequest, str]] = field(default_factory=list)  # others waiting on it


def _schema(event: cloudevent_pb2.CloudEvent) -> str:
    value = event.attributes.get(_constants.DATA_SCHEMA_ATTR)
    return value.ce_string.rsplit(".", 1)[-1] if value is not None else ""


class BalancingServicer(GrpcWorkerAgentRuntimeHostServicer):
    """The host servicer with worker pools per agent type, least-loaded routing and redelivery."""

    def __init__(self, balanced: frozenset[str] = frozenset({TESTER})) -> None:
        super().__init__()
        self.balanced = balanced
        self.pools: dict[str, list[str]] = {}
        self.inflight: dict[str, dict[str, Delivery]] = {}
        self.parked: dict[str, list[Delivery]] = {}
        self.redelivered = 0
        self.answered_from_report = 0
        self.wanted: dict[str, list[Any]] = {}  # client -> the subscriptions it asked for
        self._turn = itertools.count()
        self._wire_ids = itertools.count(1)
        self.orphans: dict[str, tuple[float, agent_worker_pb2.RpcResponse]] = {}
        self.answered_from_orphan = 0
        self.adopted = 0

    # -- registration ---------------------------------------------------------------------------

    async def RegisterAgent(self, request: agent_worker_pb2.RegisterAgentTypeRequest,  # type: ignore[override]
                            context: Any) -> agent_worker_pb2.RegisterAgentTypeResponse:
        client_id = await get_client_id_or_abort(context)
        async with self._agent_type_to_client_id_lock:
            pool = self.pools.setdefault(request.type, [])
            if client_id not in pool:
                pool.append(client_id)
            self._agent_type_to_client_id.setdefault(request.type, client_id)
        log.info("host.registered", agent_type=request.type, client=client_id, workers=len(pool))
        return agent_worker_pb2.RegisterAgentTypeResponse()

    async def AddSubscription(self, request: agent_worker_pb2.AddSubscriptionRequest,  # type: ignore[override]
                              context: Any) -> agent_worker_pb2.AddSubscriptionResponse:
        """Workers of one role ask for the same subscriptions: the first one is kept, the others noted
        (and put in its place should its worker go)."""
        client_id = await get_client_id_or_abort(context)
        subscription = subscription_from_proto(request.subscription)
        self.wanted.setdefault(client_id, []).append(subscription)
        if any(s == subscription for s in self._subscription_manager.subscriptions):
            return agent_worker_pb2.AddSubscriptionResponse()
        return await super().AddSubscription(request, context)

    async def _resubscribe(self) -> None:
        """Subscriptions that went with a dead worker, taken over by a live one that asked for them."""
        for client_id, subscriptions in self.wanted.items():
            if client_id not in self._data_connections:
                continue
            for subscription in subscriptions:
                if any(s == subscription for s in self._subscription_manager.subscriptions):
                    continue
                await self._subscription_manager.add_subscription(subscription)
                self._client_id_to_subscription_id_mapping.setdefault(client_id, set()).add(subscription.id)

    async def _on_client_disconnect(self, client_id: str) -> None:
        log.info("host.disconnected", client=client_id)
        await super()._on_client_disconnect(client_id)
        for future in self._pending_responses.pop(client_id, {}).values():
            future.cancel()  # its relay ends; the request itself is redelivered below
        self.wanted.pop(client_id, None)
        await self._resubscribe()
        async with self._agent_type_to_client_id_lock:
            for agent_type, pool in self.pools.items():
                if client_id in pool:
                    pool.remove(client_id)
                    if pool and agent_type not in self._agent_type_to_client_id:
                        self._agent_type_to_client_id[agent_type] = pool[0]
        lost = list(self.inflight.pop(client_id, {}).values())
        if lost:
            log.warning("host.worker_lost", client=client_id, in_flight=len(lost))
        for delivery in lost:
            if delivery.kind == "request" and delivery.reported is not None:
                await self._answer_from_report(delivery)
                continue
            self.redelivered += 1
            log.info("host.redelivered", kind=delivery.kind, agent_type=delivery.agent_type, source=delivery.source)
            await self._dispatch(delivery, first=True)

    def live(self, agent_type: str) -> list[str]:
        return [c for c in self.pools.get(agent_type, []) if c in self._data_connections]

    def _requests_of(self, client_id: str) -> int:
        return sum(1 for d in self.inflight.get(client_id, {}).values() if d.kind == "request")

    def _pick(self, agent_type: str, kind: str = "request") -> str | None:
        """The live worker of ``agent_type`` with the least work in flight (ties taken in turn); for a
        request to a balanced role, None while every worker has its ``PER_WORKER`` requests: the request
        waits here rather than in a busy worker, so no worker idles while work waits and a worker that
        dies takes only what it was judging with it."""
        pool = self.live(agent_type)
        if kind == "request" and agent_type in self.balanced:
            pool = [c for c in pool if self._requests_of(c) < PER_WORKER]
        if kind == "event":  # only a worker that has subscribed its role hands an event to it (else it drops it)
            pool = [c for c in pool if any(getattr(w, "agent_type", None) == agent_type for w in self.wanted.get(c, []))]
        if not pool:
            return None
        start = next(self._turn) % len(pool)
        turn = pool[start:] + pool[:start]
        return min(turn, key=lambda c: len(self.inflight.get(c, {})))

    # -- delivery -------------------------------------------------------------------------------

    async def _dispatch(self, delivery: Delivery, first: bool = False) -> None:
        """Give ``delivery`` to a worker, or queue it here (``first``: ahead of the others, as work a
        dead worker was given before them) until one is free."""
        target = self._pick(delivery.agent_type, delivery.kind)
        if target is None:  # no worker of that role free now: wait for one (to register, or to answer)
            waiting = self.parked.setdefault(delivery.agent_type, [])
            waiting.insert(0, delivery) if first else waiting.append(delivery)
            log.info("host.parked", agent_type=delivery.agent_type, source=delivery.source)
            task = asyncio.create_task(self._when_served(delivery))
            self._background_tasks.add(task)
            task.add_done_callback(self._background_tasks.discard)
            return
        delivery.tries += 1
        log.info("host.dispatched", kind=delivery.kind, source=delivery.source, worker=target,
                 in_flight=len(self.inflight.get(target, {})), workers=len(self.live(delivery.agent_type)))
        connection = self._data_connections[target]
        if delivery.kind == "event":
            assert delivery.event is not None
            self.inflight.setdefault(target, {})[f"event:{delivery.event.id}"] = delivery
            await connection.send(agent_worker_pb2.Message(cloudEvent=delivery.event))
            return
        assert delivery.request is not None
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        delivery.future = future
        delivery.wire_id = f"host-{next(self._wire_ids)}"
        forwarded = agent_worker_pb2.RpcRequest()
        forwarded.CopyFrom(delivery.request)
        forwarded.request_id = delivery.wire_id
        self._pending_responses.setdefault(target, {})[delivery.wire_id] = future
        self.inflight.setdefault(target, {})[f"request:{delivery.wire_id}"] = delivery
        await connection.send(agent_worker_pb2.Message(request=forwarded))
        task = asyncio.create_task(self._relay(delivery, target, future))
        self._background_tasks.add(task)
        task.add_done_callback(self._background_tasks.discard)

    async def _when_served(self, delivery: Delivery, poll_s: float = 0.05) -> None:
        """Dispatch a parked delivery, first come first served, once a worker of its role is connected
        and free for it."""
        waiting = self.parked.setdefault(delivery.agent_type, [])
        while waiting[0] is not delivery or self._pick(delivery.agent_type, delivery.kind) is None:
            await asyncio.sleep(poll_s)
        waiting.remove(delivery)
        await self._dispatch(delivery)

    async def _relay(self, delivery: Delivery, target: str, future: asyncio.Future[Any]) -> None:
        """Pass a response back to the caller; a cancelled wait means the worker died (redelivered)."""
        try:
            response = await future
        except asyncio.CancelledError:
            return
        assert delivery.request is not None
        self.inflight.get(target, {}).pop(f"request:{delivery.wire_id}", None)
        answer = agent_worker_pb2.RpcResponse()
        answer.CopyFrom(response)
        answer.request_id = delivery.request.request_id  # the caller's own id again
        await self._answer(delivery, answer)

    async def _answer(self, delivery: Delivery, answer: agent_worker_pb2.RpcResponse) -> None:
        """Send a verdict to the caller and to every caller that adopted the request; kept as an
        orphan when none of them is there to take it."""
        assert delivery.request is not None
        taken = await self._send_to(delivery.origin, agent_worker_pb2.Message(response=answer))
        for request, client_id in delivery.adopters:
            if answer.error or not answer.payload.data:
                again = agent_worker_pb2.RpcResponse(request_id=request.request_id, error=answer.error)
            else:
                again = readdressed(answer, request)
            taken = await self._send_to(client_id, agent_worker_pb2.Message(response=again)) or taken
        if not taken:
            self._keep_orphan(delivery.request, answer)

    def _adoptable(self, request: agent_worker_pb2.RpcRequest) -> Delivery | None:
        """A request in flight or waiting, whose caller died, that asks the same judgement as ``request``."""
        key = judgement_key(request.payload)
        if key is None:
            return None
        waiting = [d for deliveries in self.inflight.values() for d in deliveries.values()]
        waiting += [d for deliveries in self.parked.values() for d in deliveries]
        return next((d for d in waiting if d.kind == "request" and d.key == key
                     and d.origin not in self._data_connections), None)

    def _keep_orphan(self, request: agent_worker_pb2.RpcRequest, answer: agent_worker_pb2.RpcResponse) -> None:
        key = judgement_key(request.payload)
        if key is None or answer.error or not answer.payload.data:
            return
        now = time.monotonic()
        self.orphans = {k: v for k, v in self.orphans.items() if now - v[0] < ORPHAN_TTL_S}
        while len(self.orphans) >= ORPHANS_KEPT:
            self.orphans.pop(next(iter(self.orphans)))
        self.orphans[key] = (now, answer)
        log.info("host.kept_orphan_verdict", request=request.request_id)

    def _orphan_for(self, request: agent_worker_pb2.RpcRequest) -> agent_worker_pb2.RpcResponse | None:
        key = judgement_key(request.payload)
        kept = self.orphans.pop(key, None) if key is not None else None
        if kept is None or time.monotonic() - kept[0] >= ORPHAN_TTL_S:
            return None
        return readdressed(kept[1], request)

    async def _answer_from_report(self, delivery: Delivery) -> None:
        assert delivery.request is not None and delivery.reported is not None
        report = delivery.reported
        self.answered_from_report += 1
        log.info("host.answered_from_report", source=delivery.source, request=delivery.request.request_id)
        content = report.attributes.get(_constants.DATA_CONTENT_TYPE_ATTR)
        response = agent_worker_pb2.RpcResponse(
            request_id=delivery.request.request_id,
            payload=agent_worker_pb2.Payload(
                data_type=report.attributes[_constants.DATA_SCHEMA_ATTR].ce_string,
                data_content_type=content.ce_string if content is not None else "application/json",
                data=report.binary_data))
        await self._answer(delivery, response)

    async def _send_to(self, client_id: str | None, message: agent_worker_pb2.Message) -> bool:
        """Send to a client; False when it is gone."""
        connection = self._data_connections.get(client_id or "")
        if connection is None:
            log.warning("host.caller_gone", client=client_id)
            return False
        await connection.send(message)
        return True

    # -- the base servicer's entry points -------------------------------------------------------

    async def _receive_message(self, client_id: str, message: agent_worker_pb2.Message) -> None:
        if message.WhichOneof("message") == "cloudEvent":
            self._note_done(client_id, message.cloudEvent)
        await super()._receive_message(client_id, message)

    def _note_done(self, client_id: str, event: cloudevent_pb2.CloudEvent) -> None:
        """A worker's published report ends its oldest event on that session, and is kept with its
        oldest request on that session (the answer to give should the worker die before responding)."""
        if _schema(event) not in DONE_TYPES:
            return
        mine = self.inflight.get(client_id, {})
        for key, delivery in list(mine.items()):
            if delivery.source != event.source:
                continue
            if delivery.kind == "event":
                del mine[key]
                return
            if delivery.reported is None:
                delivery.reported = event
                return

    async def _process_response(self, response: agent_worker_pb2.RpcResponse, client_id: str) -> None:
        future = self._pending_responses.get(client_id, {}).pop(response.request_id, None)
        if future is None or future.done():  # an answer nobody waits for any more (its caller went)
            log.warning("host.unexpected_response", client=client_id, request=response.request_id)
            return
        future.set_result(response)

    async def _process_request(self, request: agent_worker_pb2.RpcRequest, client_id: str) -> None:
        agent_type = request.target.type
        if agent_type not in self.pools:
            await super()._process_request(request, client_id)
            return
        if agent_type in self.balanced and (kept := self._orphan_for(request)) is not None:
            self.answered_from_orphan += 1
            log.info("host.answered_from_orphan", source=request.target.key, request=request.request_id)
            await self._send_to(client_id, agent_worker_pb2.Message(response=kept))
            return
        if agent_type in self.balanced and (running := self._adoptable(request)) is not None:
            running.adopters.append((request, client_id))  # the judgement a dead caller asked for, still going
            self.adopted += 1
            log.info("host.adopted_in_flight", source=request.target.key, request=request.request_id)
            return
        await self._dispatch(Delivery(kind="request", agent_type=agent_type, source=request.target.key,
                                      request=request, origin=client_id, key=judgement_key(request.payload)))

    async def _process_event(self, event: cloudevent_pb2.CloudEvent) -> None:
        recipients = await self._subscription_manager.get_subscribed_recipients(
            TopicId(type=event.type, source=event.source))
        clients: set[str] = set()
        for agent_type in sorted({r.type for r in recipients}):
            if agent_type in self.balanced:
                await self._dispatch(Delivery(kind="event", agent_type=agent_type, source=event.source, event=event))
                continue
            for client in self.live(agent_type) or [c for c in [self._agent_type_to_client_id.get(agent_type)] if c]:
                clients.add(client)
                break
        for client in clients:
            await self._send_to(client, agent_worker_pb2.Message(cloudEvent=event))
