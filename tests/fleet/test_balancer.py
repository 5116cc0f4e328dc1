"""The host's router with several callers: each numbers its requests from one, and each still gets the
answer to its own request (two daemons asking one tester at the same time); a verdict whose caller died
answers the same draft asked again by another (a job carried on after its daemon was killed)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from autogen_core import AgentId, MessageContext, RoutedAgent, message_handler

from actors.host import BalancingHost
from jaxbench.report import EvalReport as JudgeReport
from maxkernel.messages import EvalReport, EvalRequest, KernelDraft, Plan, Recall, RecallRequest, RecalledNote, StrategyRef
from maxkernel.runtime import TESTER, connect_worker

from conftest import free_port


class Echo(RoutedAgent):
    """Answers a recall request, after a pause so that the callers' requests are in flight together."""

    def __init__(self) -> None:
        super().__init__("echo")

    @message_handler
    async def on_request(self, message: RecallRequest, ctx: MessageContext) -> Recall:
        await asyncio.sleep(0.5)
        return Recall(session_id=message.session_id, task_id=message.task_id,
                      notes=[RecalledNote(id=message.session_id, score=1.0, outcome="info", text=message.task_id)])


@contextlib.asynccontextmanager
async def hosted(agent: type[RoutedAgent], agent_type: str, callers: int) -> AsyncIterator[tuple[Any, list[Any]]]:
    """A balancing host on loopback, one worker serving ``agent`` and ``callers`` worker runtimes to ask it."""
    address = f"127.0.0.1:{free_port()}"
    host = BalancingHost(address)
    await host.start()
    runtimes: list[Any] = []
    try:
        server = await connect_worker(address, token="")
        runtimes.append(server)
        await agent.register(server, agent_type, agent)
        asking = [await connect_worker(address, token="") for _ in range(callers)]
        runtimes += asking
        await asyncio.sleep(0.5)  # the registration reaches the host
        yield host, asking
    finally:
        for runtime in runtimes:
            with contextlib.suppress(Exception):
                await runtime.stop()
        await host.stop()


def test_callers_with_the_same_request_ids_each_get_their_own_answer() -> None:
    async def scenario() -> None:
        async with hosted(Echo, "echo", 3) as (host, callers):
            async def ask(runtime: object, name: str, n: int) -> list[str]:
                replies = []
                for i in range(n):  # every caller's ids run 1, 2, ...: the same on the wire from each
                    reply = await runtime.send_message(  # type: ignore[attr-defined]
                        RecallRequest(session_id=f"{name}-{i}", task_id=name), AgentId("echo", f"{name}-{i}"))
                    replies.append(reply.notes[0].id)
                return replies

            got = await asyncio.wait_for(
                asyncio.gather(*(ask(c, f"caller{k}", 2) for k, c in enumerate(callers))), 60)
            assert got == [[f"caller{k}-0", f"caller{k}-1"] for k in range(3)]
            assert not any(host.servicer.inflight.values())  # every answer was taken off the books

    asyncio.run(scenario())


class Judge(RoutedAgent):
    """A tester that takes its time and counts what it was asked to judge."""

    asked: list[str] = []

    def __init__(self) -> None:
        super().__init__("slow judge")

    @message_handler
    async def on_request(self, message: EvalRequest, ctx: MessageContext) -> EvalReport:
        Judge.asked.append(message.candidate_id or "")
        await asyncio.sleep(1.5)
        report = JudgeReport(task=message.task_id, target="cpu", size="cpu", status="ok", correct=True,
                             reason=f"judged as {message.candidate_id}")
        return EvalReport(session_id=message.session_id, task_id=message.task_id, candidate_id=message.candidate_id,
                          draft=message.draft, report=report)


def _request(session: str, candidate: str, source: str) -> EvalRequest:
    plan = Plan(session_id=session, task_id="12p_RMSNorm", strategies=[StrategyRef(name="rowblock")])
    draft = KernelDraft(session_id=session, task_id="12p_RMSNorm", candidate_id=candidate, plan=plan, source=source)
    return EvalRequest(session_id=session, task_id="12p_RMSNorm", candidate_id=candidate, draft=draft)


def test_a_verdict_whose_caller_died_answers_the_same_draft_asked_again() -> None:
    async def scenario() -> None:
        async with hosted(Judge, TESTER, 2) as (host, (dying, later)):
            asked = asyncio.ensure_future(dying.send_message(_request("s1", "c1", "def kernel(x): return x"),
                                                             AgentId(TESTER, "s1")))
            await asyncio.sleep(0.5)
            await dying.stop()  # the daemon dies while its draft is being judged
            asked.cancel()
            await asyncio.sleep(2.5)  # the verdict comes, with nobody to take it
            assert len(host.servicer.orphans) == 1

            reply = await asyncio.wait_for(later.send_message(_request("s2", "c2", "def kernel(x): return x"),
                                                              AgentId(TESTER, "s2")), 30)
            assert Judge.asked == ["c1"] and host.servicer.answered_from_orphan == 1  # not judged again
            assert isinstance(reply, EvalReport) and reply.report.reason == "judged as c1"
            assert (reply.session_id, reply.candidate_id, reply.draft.candidate_id) == ("s2", "c2", "c2")
            assert host.servicer.orphans == {}  # a kept verdict answers once

            other = await asyncio.wait_for(later.send_message(_request("s2", "c3", "def kernel(x): return x + 0"),
                                                              AgentId(TESTER, "s2")), 30)
            assert Judge.asked == ["c1", "c3"] and other.report.reason == "judged as c3"  # other code is judged

    asyncio.run(scenario())


def test_a_draft_asked_again_while_its_dead_callers_judgement_runs_adopts_it() -> None:
    async def scenario() -> None:
        Judge.asked = []
        async with hosted(Judge, TESTER, 2) as (host, (dying, later)):
            asked = asyncio.ensure_future(dying.send_message(_request("s1", "c1", "def kernel(x): return x * 1"),
                                                             AgentId(TESTER, "s1")))
            await asyncio.sleep(0.3)
            await dying.stop()  # the daemon dies while its draft is being judged
            asked.cancel()
            await asyncio.sleep(0.3)  # its job carried on by another daemon, which asks the same draft
            reply = await asyncio.wait_for(later.send_message(_request("s2", "c2", "def kernel(x): return x * 1"),
                                                              AgentId(TESTER, "s2")), 30)
            assert Judge.asked == ["c1"] and host.servicer.adopted == 1  # one judgement, not two
            assert isinstance(reply, EvalReport) and reply.report.reason == "judged as c1"
            assert (reply.session_id, reply.candidate_id, reply.draft.candidate_id) == ("s2", "c2", "c2")
            assert host.servicer.orphans == {}  # taken by the adopter: nothing left to keep

    asyncio.run(scenario())


def test_a_busy_tester_is_given_one_request_and_the_next_waits_at_the_host() -> None:
    async def scenario() -> None:
        Judge.asked = []
        async with hosted(Judge, TESTER, 2) as (host, callers):
            replies = [asyncio.ensure_future(c.send_message(_request(f"s{k}", f"c{k}", f"def kernel(x): return x + {k}"),
                                                            AgentId(TESTER, f"s{k}"))) for k, c in enumerate(callers)]
            await asyncio.sleep(0.5)
            assert len(Judge.asked) == 1 and len(host.servicer.parked[TESTER]) == 1  # waits here, not in the worker
            got = await asyncio.wait_for(asyncio.gather(*replies), 30)
            assert sorted(r.candidate_id for r in got) == ["c0", "c1"] and len(Judge.asked) == 2
            assert host.servicer.parked[TESTER] == []

    asyncio.run(scenario())
