"""The gRPC host for many machines: workers (``python -m actors.worker``) connect to it.

    python -m actors.host 127.0.0.1:50051

It routes messages between workers and holds no actors itself. Several workers may serve one role: the
tester's work is spread over them and a dead worker's evaluation is given to another
(``actors.balancer``). Bound beyond loopback it refuses to start without a token in the settings, and
then refuses every client that does not present it. Stops on SIGTERM or SIGINT.
"""

from __future__ import annotations

import asyncio
import signal
import sys

from typing import Any

import grpc
import structlog
from autogen_ext.runtimes.grpc.protos import agent_worker_pb2_grpc

from actors.balancer import BalancingServicer
from maxkernel.auth import is_loopback, matches, presented

log = structlog.get_logger("actors.host")


class BindRefused(ValueError):
    """An address beyond loopback without a token to guard it."""


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """Refuses every call that does not present the settings' token (``maxkernel.auth``)."""

    def __init__(self, token: str) -> None:
        self.token = token

        async def refuse(_request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "a valid token is required")

        self._refusal = grpc.unary_unary_rpc_method_handler(refuse)
        self._stream_refusal = grpc.stream_stream_rpc_method_handler(refuse)  # type: ignore[arg-type]

    async def intercept_service(self, continuation: Any, details: grpc.HandlerCallDetails) -> Any:
        agent = dict(details.invocation_metadata or ()).get("user-agent", "")
        if matches(presented(str(agent)), self.token):
            return await continuation(details)
        log.warning("host.refused", method=details.method)
        return self._stream_refusal if details.method.endswith("Channel") else self._refusal


class BalancingHost:
    """A gRPC server running the balancing servicer on one address; bound beyond loopback it requires
    the settings' token from every client."""

    def __init__(self, address: str, token: str = "") -> None:
        if not is_loopback(address) and not token:
            raise BindRefused(f"the gRPC host on {address} is reachable beyond this machine: set a token "
                              "(MAXKERNEL_TOKEN or `token:` in the config) or bind 127.0.0.1")
        self.address = address
        self.servicer = BalancingServicer()
        self.server = grpc.aio.server(interceptors=[TokenInterceptor(token)] if token else None)
        agent_worker_pb2_grpc.add_AgentRpcServicer_to_server(self.servicer, self.server)
        self.port = self.server.add_insecure_port(address)

    async def start(self) -> None:
        await self.server.start()

    async def stop(self, grace: float = 2.0) -> None:
        await self.server.stop(grace)


async def serve(address: str, token: str = "") -> None:
    host = BalancingHost(address, token)
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
    from maxkernel.config import load_settings

    try:
        asyncio.run(serve(args[0], load_settings().token))
    except BindRefused as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
