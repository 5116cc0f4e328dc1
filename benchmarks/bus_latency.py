"""Bus benchmark: message round-trip latency and throughput, local runtime and gRPC on loopback, in one run.

A round trip is what actors do: publish a message on a topic, an echo actor publishes one back on a reply
topic (pub/sub), and, as tools do, a direct request answered by the actor (RPC). Locally both sides share
one ``SingleThreadedAgentRuntime``; over gRPC the echo actor lives in a separate worker process and every
message goes through a ``GrpcWorkerAgentRuntimeHost`` on 127.0.0.1. Targets: local p50 under 1 ms, gRPC
p50 under 10 ms.

    python benchmarks/bus_latency.py                  # 2000 round trips per figure
    python benchmarks/bus_latency.py --n 500 --payload 4096
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

from autogen_core import (
    AgentId,
    ClosureAgent,
    ClosureContext,
    MessageContext,
    RoutedAgent,
    TopicId,
    TypeSubscription,
    message_handler,
)
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from maxkernel.messages import Ping  # noqa: E402
from maxkernel.runtime import add_serializers, connect_worker, local_runtime, start_host  # noqa: E402

ECHO, REPLY = "bench_echo", "bench_reply"


class Echo(RoutedAgent):
    """Answers a direct Ping with itself; a published Ping is published back on the reply topic."""

    def __init__(self) -> None:
        super().__init__("echo")

    @message_handler
    async def on_ping(self, message: Ping, ctx: MessageContext) -> Ping | None:
        if ctx.topic_id is None:
            return message
        await self.publish_message(message, TopicId(REPLY, ctx.topic_id.source))
        return None


async def add_echo(runtime: Any) -> None:
    await Echo.register(runtime, ECHO, Echo, skip_class_subscriptions=True)
    await runtime.add_subscription(TypeSubscription(ECHO, ECHO))


class Pinger:
    """Publishes Pings and resolves each when its echo comes back on the reply topic."""

    def __init__(self) -> None:
        self.pending: dict[int, asyncio.Future[int]] = {}

    async def register(self, runtime: Any) -> None:
        async def on_reply(_c: ClosureContext, message: Ping, _m: MessageContext) -> None:
            future = self.pending.pop(message.n, None)
            if future is not None and not future.done():
                future.set_result(time.perf_counter_ns())

        await ClosureAgent.register_closure(runtime, "bench_pinger", on_reply,
                                            subscriptions=lambda: [TypeSubscription(REPLY, "bench_pinger")])

    async def publish_round_trip(self, runtime: Any, n: int, payload: str) -> float:
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.pending[n] = future
        start = time.perf_counter_ns()
        await runtime.publish_message(Ping(n=n, sent_ns=start, payload=payload), TopicId(ECHO, "bench"))
        end = await asyncio.wait_for(future, 30)
        return (end - start) / 1e6


async def rpc_round_trip(runtime: Any, n: int, payload: str) -> float:
    start = time.perf_counter_ns()
    reply = await runtime.send_message(Ping(n=n, sent_ns=start, payload=payload), AgentId(ECHO, "bench"))
    assert isinstance(reply, Ping) and reply.n == n
    return (time.perf_counter_ns() - start) / 1e6


async def measure(trip: Callable[[int], Awaitable[float]], n: int, concurrency: int) -> dict[str, float]:
    for i in range(min(100, n)):  # warm-up: agent creation, connections, JIT of serializers
        await trip(-1 - i)
    latencies = [await trip(i) for i in range(n)]
    start = time.perf_counter()
    counter = iter(range(n, 2 * n))

    async def lane() -> None:
        for i in counter:
            await trip(i)

    await asyncio.gather(*(lane() for _ in range(concurrency)))
    elapsed = time.perf_counter() - start
    q = statistics.quantiles(latencies, n=100)
    return {"p50": statistics.median(latencies), "p95": q[94], "p99": q[98], "throughput": n / elapsed}


async def bench_runtime(runtime: Any, n: int, concurrency: int, payload: str) -> dict[str, dict[str, float]]:
    pinger = Pinger()
    await pinger.register(runtime)
    pub = await measure(lambda i: pinger.publish_round_trip(runtime, i, payload), n, concurrency)
    rpc = await measure(lambda i: rpc_round_trip(runtime, i, payload), n, concurrency)
    return {"pub/sub": pub, "rpc": rpc}


async def bench_local(n: int, concurrency: int, payload: str) -> dict[str, dict[str, float]]:
    runtime = local_runtime()
    add_serializers(runtime)
    await add_echo(runtime)
    runtime.start()
    try:
        return await bench_runtime(runtime, n, concurrency, payload)
    finally:
        await runtime.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def bench_grpc(n: int, concurrency: int, payload: str) -> dict[str, dict[str, float]]:
    address = f"127.0.0.1:{_free_port()}"
    host = start_host(address)
    echo = subprocess.Popen([sys.executable, __file__, "--echo-worker", address], stdout=subprocess.PIPE, text=True,
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert echo.stdout is not None
        line = await asyncio.to_thread(echo.stdout.readline)
        if line.strip() != "ready":
            raise RuntimeError(f"echo worker did not start (exit {echo.poll()})")
        runtime = await connect_worker(address)
        try:
            return await bench_runtime(runtime, n, concurrency, payload)
        finally:
            await runtime.stop()
    finally:
        echo.send_signal(signal.SIGTERM)
        try:
            echo.wait(timeout=20)
        except subprocess.TimeoutExpired:
            echo.kill()
        await host.stop()


async def echo_worker(address: str) -> None:
    runtime = await connect_worker(address)
    await add_echo(runtime)
    print("ready", flush=True)
    await runtime.stop_when_signal()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="round trips per figure")
    parser.add_argument("--concurrency", type=int, default=32, help="round trips in flight for throughput")
    parser.add_argument("--payload", type=int, default=256, help="payload bytes per message")
    parser.add_argument("--echo-worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.echo_worker:
        asyncio.run(echo_worker(args.echo_worker))
        return 0
    import logging

    logging.getLogger("autogen_core").setLevel(logging.WARNING)
    payload = "x" * args.payload
    console = Console()
    results = {}
    with console.status("local runtime"):
        results["local"] = asyncio.run(bench_local(args.n, args.concurrency, payload))
    with console.status("gRPC on loopback (host + echo worker process)"):
        results["grpc"] = asyncio.run(bench_grpc(args.n, args.concurrency, payload))
    table = Table(title=f"bus round trips: n={args.n}, payload {args.payload} B, throughput at {args.concurrency} in flight")
    for column in ("runtime", "kind", "p50 ms", "p95 ms", "p99 ms", "round trips/s"):
        table.add_column(column, justify="right")
    for runtime, kinds in results.items():
        for kind, r in kinds.items():
            table.add_row(runtime, kind, f"{r['p50']:.3f}", f"{r['p95']:.3f}", f"{r['p99']:.3f}", f"{r['throughput']:.0f}")
    console.print(table)
    local_p50, grpc_p50 = results["local"]["pub/sub"]["p50"], results["grpc"]["pub/sub"]["p50"]
    console.print(f"pub/sub p50: local {local_p50:.3f} ms (target < 1 ms: {'met' if local_p50 < 1 else 'MISSED'}), "
                  f"gRPC {grpc_p50:.3f} ms (target < 10 ms: {'met' if grpc_p50 < 10 else 'MISSED'}); "
                  f"gRPC/local p50 ratio {grpc_p50 / local_p50:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
