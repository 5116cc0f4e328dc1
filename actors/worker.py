"""A gRPC worker process: hosts some actor roles and serves them to the host until told to stop.

    python -m actors.worker --host 127.0.0.1:50051 --roles tester --config actors.json

It prints ``ready <roles>`` on stdout once its actors are registered, and stops on SIGTERM or SIGINT. A
tester's evaluator sandbox is started before that, so the first evaluation pays no start-up. With
``--standby`` it gets everything ready (imports, services, the sandbox, the connection to the host), prints
``standby`` and registers its actors only when sent SIGUSR1: a warm spare that takes a dead worker's place
at once. With ``--supervise [--count N] [--spares S]`` it instead keeps N such workers running and S spares
warm (``actors.supervisor``).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from actors.standby import arm, promoted_or_stopped

if TYPE_CHECKING:
    from actors.config import ActorConfig
    from actors.services import Services

# What a worker imports before it serves, imported once by its supervisor's zygote (``jaxbench.zygote``) rather
# than by every worker started: none of them starts a thread or opens a connection at import.
PRELOAD = ("actors.config", "actors.registry", "actors.services", "maxkernel.logging", "maxkernel.runtime",
           "maxkernel.evaluation", "jaxbench.evaluate", "autogen_ext.runtimes.grpc", "jax.numpy", "maxkernel.compile_cache")


def prefork(services: Services, roles: list[str]) -> None:
    """Start the evaluator's sandbox now (a tester's), rather than on the first evaluation it is given."""
    from maxkernel.runtime import TESTER

    if TESTER in roles:
        pool = services.evaluator.pool
        pool.release(pool.acquire())


async def serve(host: str, roles: list[str], config: ActorConfig, *, standby: bool = False) -> None:
    from actors.registry import register_actors
    from actors.services import Services
    from maxkernel.runtime import connect_worker

    services = Services(config)
    try:
        await asyncio.to_thread(prefork, services, roles)
        worker = await connect_worker(host)
        serving = False
        try:
            if standby:
                print("standby", flush=True)
                if not await promoted_or_stopped():
                    return
            await register_actors(worker, services, roles)
            print("ready " + ",".join(roles), flush=True)
            serving = True
            await worker.stop_when_signal()
        finally:
            if not serving:
                await worker.stop()
    finally:
        await services.aclose()


def main(argv: list[str] | None = None) -> int:
    arm()  # first of all: a spare may be promoted while it still imports
    parser = argparse.ArgumentParser(prog="python -m actors.worker", description=__doc__.splitlines()[0])
    parser.add_argument("--host", required=True, help="address of the gRPC host, e.g. 127.0.0.1:50051")
    parser.add_argument("--roles", required=True, help="comma-separated roles, e.g. tester or planner,coder")
    parser.add_argument("--config", type=Path, help="ActorConfig as a YAML or JSON file")
    parser.add_argument("--standby", action="store_true", help="get ready, then register only when sent SIGUSR1")
    parser.add_argument("--supervise", action="store_true", help="keep --count workers alive, restarting any that dies")
    parser.add_argument("--count", type=int, default=1, help="workers to keep alive under --supervise")
    parser.add_argument("--spares", type=int, default=0, help="standby workers kept warm under --supervise, "
                                                              "each taking a dead worker's place at once")
    args = parser.parse_args(argv)
    if args.count < 1 or args.spares < 0:
        parser.error("--count must be at least 1, --spares at least 0")
    from maxkernel.logging import configure

    configure("info" if args.supervise else "warning")
    if args.supervise:
        from actors.supervisor import Supervisor

        worker_args = ["--host", args.host, "--roles", args.roles, *(["--config", str(args.config)] if args.config else [])]
        return Supervisor(worker_args, args.count, spares=args.spares).run()
    from actors.config import ActorConfig
    from maxkernel.auth import HostUnreachable
    from maxkernel.compile_cache import use_compile_cache
    from maxkernel.config import load_settings

    # The workers of a host share their compiled programs: one started in a dead one's place judges its first
    # candidates without compiling again what the judge traces (the evaluator's sandbox never reads it).
    use_compile_cache(load_settings().cache_path / "jax")
    config = ActorConfig.from_file(args.config) if args.config else ActorConfig()
    try:
        asyncio.run(serve(args.host, [r.strip() for r in args.roles.split(",") if r.strip()], config,
                          standby=args.standby))
    except KeyboardInterrupt:
        pass
    except HostUnreachable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
