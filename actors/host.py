"""The gRPC host for many machines: workers (``python -m actors.worker``) connect to it.

    python -m actors.host 0.0.0.0:50051

It routes messages between workers; it holds no actors itself. Stops on SIGTERM or SIGINT.
"""

from __future__ import annotations

import asyncio
import sys

from maxkernel.runtime import start_host


async def serve(address: str) -> None:
    host = start_host(address)
    print(f"host listening on {address}", flush=True)
    await host.stop_when_signal()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m actors.host ADDRESS (e.g. 0.0.0.0:50051)", file=sys.stderr)
        return 2
    try:
        asyncio.run(serve(args[0]))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
