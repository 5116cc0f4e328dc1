"""The gRPC host for many machines: workers (``python -m actors.worker``) connect to it.

    python -m actors.host 127.0.0.1:50051

It routes messages between workers and holds no actors itself. Several workers may serve one role: the
tester's work is spread over them and a dead worker's evaluation is given to another
(``actors.balancer``). Stops on SIGTERM or SIGINT.
"""

from __future__ import annotations

import asyncio
import signal
import sys

import grpc
import structlog
from autogen_ext.runtimes.grpc.protos import agent_worker_pb2_grpc

from actors.balancer import BalancingServicer

log = structlog.get_logger("actors.host")


class BalancingHost:
    """A gRPC server running the balancing servicer on one address."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.servicer = BalancingServicer()
        self.server = grpc.aio.server()
        agent_worker_pb2_grpc.add_AgentRpcServicer_to_server(self.servicer, self.server)
        self.port = self.server.add_insecure_port(address)

    async def start(self) -> None:
        await self.server.start()

    async def stop(self, grace: float = 2.0) -> None:
        await self.server.stop(grace)


async def serve(address: str) -> None:
    host = BalancingHost(address)
    await host.start()
    print(f"host listening on {address}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await host.stop()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m actors.host ADDRESS (e.g. 127.0.0.1:50051)", file=sys.stderr)
        return 2
    from maxkernel.logging import configure

    configure("info")
    try:
        asyncio.run(serve(args[0]))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
