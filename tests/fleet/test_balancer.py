"""The host's router with several callers: each numbers its requests from one, and each still gets the
answer to its own request (two daemons asking one tester at the same time)."""

from __future__ import annotations

import asyncio
import contextlib

from autogen_core import AgentId, MessageContext, RoutedAgent, message_handler

from actors.host import BalancingHost
from maxkernel.messages import Recall, RecallRequest, RecalledNote
from maxkernel.runtime import connect_worker

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


def test_callers_with_the_same_request_ids_each_get_their_own_answer() -> None:
    async def scenario() -> None:
        address = f"127.0.0.1:{free_port()}"
        host = BalancingHost(address)
        await host.start()
        runtimes = []
        try:
            server = await connect_worker(address, token="")
            runtimes.append(server)
            await Echo.register(server, "echo", Echo)
            callers = [await connect_worker(address, token="") for _ in range(3)]
            runtimes += callers
            await asyncio.sleep(0.5)  # the registration reaches the host

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
        finally:
            for runtime in runtimes:
                with contextlib.suppress(Exception):
                    await runtime.stop()
            await host.stop()

    asyncio.run(scenario())
