"""A gRPC worker process: hosts some actor roles and serves them to the host until told to stop.

    python -m actors.worker --host 127.0.0.1:50051 --roles tester --config actors.json

It prints ``ready <roles>`` on stdout once its actors are registered, and stops on SIGTERM or SIGINT.
With ``--supervise [--count N]`` it instead keeps N such workers running, starting again any that dies
(``actors.supervisor``).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from actors.config import ActorConfig
from actors.registry import register_actors
from actors.services import Services


async def serve(host: str, roles: list[str], config: ActorConfig) -> None:
    from maxkernel.runtime import connect_worker

    services = Services(config)
    worker = await connect_worker(host)
    try:
        await register_actors(worker, services, roles)
        print("ready " + ",".join(roles), flush=True)
        await worker.stop_when_signal()
    finally:
        await services.aclose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m actors.worker", description=__doc__.splitlines()[0])
    parser.add_argument("--host", required=True, help="address of the gRPC host, e.g. 127.0.0.1:50051")
    parser.add_argument("--roles", required=True, help="comma-separated roles, e.g. tester or planner,coder")
    parser.add_argument("--config", type=Path, help="ActorConfig as a YAML or JSON file")
    parser.add_argument("--supervise", action="store_true", help="keep --count workers alive, restarting any that dies")
    parser.add_argument("--count", type=int, default=1, help="workers to keep alive under --supervise")
    args = parser.parse_args(argv)
    if args.count < 1:
        parser.error("--count must be at least 1")
    from maxkernel.logging import configure

    configure("info" if args.supervise else "warning")
    if args.supervise:
        from actors.supervisor import Supervisor

        worker_args = ["--host", args.host, "--roles", args.roles, *(["--config", str(args.config)] if args.config else [])]
        return Supervisor(worker_args, args.count).run()
    config = ActorConfig.from_file(args.config) if args.config else ActorConfig()
    try:
        asyncio.run(serve(args.host, [r.strip() for r in args.roles.split(",") if r.strip()], config))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
