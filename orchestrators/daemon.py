"""The daemon: works through the job queue for as long as it runs, several jobs at a time.

Each job is one Auto run on the shared evaluator, store and memory; its best kernel and note go into
memory when it ends, so later jobs start from it. A job on a model layer (category ``model``) is the
whole-layer run of ``maxkernel optimize-model`` (``orchestrators.model_opt``): its region sessions are
Auto runs on the same services, and its layer file is written under ``<data_dir>/models/<job id>/``. Jobs live in the store (``orchestrators.jobs``): a
daemon claims jobs under a lease it renews (``orchestrators.claims``), so many daemons share one queue and a
dead one's jobs are taken over when their leases end (at once when it ran on this host); a job run
again carries on from what its earlier sessions evaluated (``AutoRun.restore``); SIGTERM stops it gracefully (running
jobs are cancelled and queued again, the HTTP API closes, the state file goes). With ``--testers HOST``
the jobs' evaluations go through that gRPC host to the fleet's tester workers
(``orchestrators.fleet_tester``) instead of this process's evaluator. ``python -m orchestrators.daemon``
is the process ``maxkernel daemon start`` spawns.

With ``--standby`` a daemon is a warm spare: it imports everything, opens the store and the memory, connects
to the testers' host (or starts its own evaluator's sandbox), initialises JAX, serves its status API, prints
``standby`` and claims nothing until it is sent SIGUSR1; it then prints ``ready daemon`` and works like any
other. ``--supervise --count N --spares S`` keeps N daemons and S such spares alive (``actors.supervisor``),
each in a data folder of its own under ``<data dir>/daemons/``: a daemon that dies is replaced at once by a
spare, and a new spare is started behind it; the dead daemon's jobs are taken over as always (its leases
ended as soon as its death is seen on this host).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog
from pydantic import BaseModel

from actors.services import Services
from actors.standby import arm, promoted_or_stopped
from maxkernel.config import Settings, load_settings
from maxkernel.messages import new_id
from maxkernel.runtime import TESTER
from orchestrators.auto import AutoBudget, AutoResult, messages_of, run_auto
from orchestrators.httpapi import ApiServer, BindRefused, auth_headers
from orchestrators.claims import DEFAULT_LEASE_S, Claimer, owner_writer
from orchestrators.daemon_memory import DaemonServices
from orchestrators.fleet_tester import FleetLink, FleetUnreachable, fleet_tester
from orchestrators.jobs import JobInfo, JobQueue

log = structlog.get_logger("orchestrators.daemon")

STATE_FILE = "daemon.json"
# What a daemon imports before it serves, imported once by its supervisor's zygote (``jaxbench.zygote``) rather
# than by every daemon started: none of them starts a thread or opens a connection at import.
PRELOAD = ("actors.session", "actors.registry", "actors.brains.rules", "orchestrators.dashboard", "maxkernel.logging",
           "maxkernel.runtime", "autogen_ext.runtimes.grpc", "memory", "chromadb", "psycopg", "jax.numpy",
           # what the rules brain's planner and coder import on first use (the learned cost model's library
           # alone is 1.5 s of CPU, paid by every fresh daemon's first plan otherwise)
           "maxkernel.analysis", "maxkernel.rules", "maxkernel.compile_cache", "actors.priors", "maxkernel.tuning.learned",
           "sklearn.ensemble", "threadpoolctl")
DEAD_CHECK_S = 1.0  # how often a daemon looks for jobs held by dead daemons of its host


class DaemonState(BaseModel):
    """What a running daemon writes to ``<data_dir>/daemon.json`` so that clients can find it."""

    pid: int
    port: int
    concurrency: int
    started_at: datetime
    standby: bool = False  # a warm spare that claims nothing until promoted


def state_path(settings: Settings) -> Path:
    return settings.data_path / STATE_FILE


def read_state(settings: Settings) -> DaemonState | None:
    """The state of a live daemon, or None (a stale file from a dead one is ignored)."""
    path = state_path(settings)
    try:
        state = DaemonState.model_validate_json(path.read_text())
    except (OSError, ValueError):
        return None
    try:
        os.kill(state.pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return state


class Daemon:
    def __init__(self, settings: Settings, *, concurrency: int = 2, port: int = 0, poll_s: float = 0.5,
                 lease_s: float = DEFAULT_LEASE_S, testers: str | None = None, bind: str = "127.0.0.1",
                 standby: bool = False) -> None:
        self.settings, self.concurrency, self.port, self.poll_s = settings, concurrency, port, poll_s
        self.standby = standby
        self.bind = bind
        self.link = FleetLink(testers, token=settings.token) if testers else None
        self.lease_s, self._renewed_at, self._looked_for_dead_at = lease_s, 0.0, 0.0
        self.running: dict[str, asyncio.Task[None]] = {}
        self.peak_running = 0
        self.finished = 0
        self.started_at = datetime.now(UTC)
        self._stop = asyncio.Event()
        self._services: dict[str, Services] = {}
        self._unswept: set[str] = set()  # memory writers (dead daemons) whose unrecorded vectors are still to forget
        self._sweeping: asyncio.Task[None] | None = None

    # -- the shared services, one per brain --------------------------------------------------------

    def services(self, brain: str) -> Services:
        """Services for ``brain``, all on one evaluator, store and memory (so memory feeds every job)."""
        if brain not in self._services:
            from actors.session import config_for_brain

            config = config_for_brain(brain).model_copy(update={"remember": False, "data_dir": self.settings.data_dir or None})
            actors = {TESTER: fleet_tester(self.link)} if self.link is not None else None
            base = self._services.get("rules")
            if base is None:
                self._services[brain] = DaemonServices(config, actors=actors)
            else:
                self._services[brain] = DaemonServices(config, evaluator=base.evaluator, memory=base.memory,
                                                       store=base.store, actors=actors)
        return self._services[brain]

    def status(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "concurrency": self.concurrency, "running": sorted(self.running),
                "standby": self.standby,
                "testers": self.link.address if self.link is not None else "local",
                "sent_to_testers": self.link.sent if self.link is not None else 0,
                "peak_running": self.peak_running, "finished": self.finished, "jobs": self.queue.counts(),
                "started_at": self.started_at.isoformat()}

    # -- jobs -------------------------------------------------------------------------------------

    async def run_job(self, job: JobInfo) -> None:
        """One job: an Auto run on its task, or, for a model layer, the whole-layer run whose region
        sessions are Auto runs on the same services (``orchestrators.model_opt``)."""
        log.info("daemon.job_started", job=job.id, task=job.task_id, attempt=job.attempts)
        try:
            services = self.services(job.brain)
            task = await asyncio.to_thread(services.task, job.task_id)
            run = self._model_job if task.spec.category == "model" else self._auto_job
            summary, status, reason = await run(job, services)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bad task or brain fails the job, never the daemon
            log.warning("daemon.job_failed", job=job.id, error=f"{type(exc).__name__}: {exc}")
            await asyncio.to_thread(self.claims.finish, job.id, "failed", None, f"{type(exc).__name__}: {exc}")
            return
        await asyncio.to_thread(self.claims.finish, job.id, status, summary, None if status == "done" else reason)
        self.finished += 1
        log.info("daemon.job_finished", job=job.id, status=status, reason=reason)

    async def _auto_job(self, job: JobInfo, services: Services) -> tuple[dict[str, Any], str, str]:
        """An Auto run that carries on from the job's earlier (interrupted) sessions."""
        from actors.session import check_keys

        session_id, earlier = new_id(), list(job.sessions)
        await asyncio.to_thread(self.queue.started, job.id, session_id)
        check_keys(services.config)  # after the session is recorded: a job without its key still shows its attempt
        prior = await asyncio.to_thread(messages_of, services.store, earlier) if earlier else []
        result = await run_auto(job.task_id, services=services, target=job.target, budget=job.budget,
                                session_id=session_id, mode="daemon", prior=prior)
        status = "done" if result.status in ("scored", "failed", "budget") else "failed"
        return result.model_dump(mode="json"), status, result.stop_reason

    async def _model_job(self, job: JobInfo, services: Services) -> tuple[dict[str, Any], str, str]:
        """A whole-layer run; each region session is one of the job's sessions. A job run again starts the
        layer over (its regions are other tasks), with what the first run remembered in memory."""
        from actors.session import check_keys
        from orchestrators.model_opt import run_model

        check_keys(services.config)

        async def region(info: Any, budget: AutoBudget) -> AutoResult:
            session_id = new_id()
            await asyncio.to_thread(self.queue.started, job.id, session_id)
            return await run_auto(info.path, services=services, target=job.target, budget=budget,
                                  session_id=session_id, mode="daemon")

        result = await run_model(job.task_id, out=self.settings.data_path / "models" / job.id, budget=job.budget,
                                 target=job.target, run_region=region, evaluator=services.evaluator)
        reason = "; ".join(result.notes)
        return result.model_dump(mode="json"), "done" if result.correct else "failed", reason or "no correct layer"

    def _done(self, job_id: str, task: asyncio.Task[None]) -> None:
        self.running.pop(job_id, None)
        if task.cancelled():
            return
        if task.exception() is not None:
            log.error("daemon.job_crashed", job=job_id, error=str(task.exception()))

    async def _fill(self) -> None:
        while len(self.running) < self.concurrency and not self._stop.is_set():
            job = await asyncio.to_thread(self.claims.claim)
            if job is None:
                return
            task = asyncio.create_task(self.run_job(job), name=f"job-{job.id}")
            self.running[job.id] = task
            task.add_done_callback(lambda t, job_id=job.id: self._done(job_id, t))
            self.peak_running = max(self.peak_running, len(self.running))

    async def _look_for_dead(self) -> None:
        """Jobs of a daemon of this host that died are made claimable as soon as the death is seen (every
        ``DEAD_CHECK_S``), not when their leases end: the next free slot of any daemon takes them, before
        queued jobs of their priority."""
        now = time.monotonic()
        if now - self._looked_for_dead_at < DEAD_CHECK_S:
            return
        self._looked_for_dead_at = now
        await self._take_over_dead()

    async def _take_over_dead(self) -> None:
        """End the leases of dead daemons of this host, then forget, beside the main loop, the vectors each of
        them stored whose records never committed (it died between the two): the memory stays the same in SQL
        and Chroma. A sweep that finds Chroma down is made again at the next look."""
        dead = await asyncio.to_thread(self.claims.expire_dead_here)
        self._unswept |= {owner_writer(owner) for owner in dead.values()}
        if self._unswept and (self._sweeping is None or self._sweeping.done()):
            self._sweeping = asyncio.create_task(self._sweep(sorted(self._unswept)), name="sweep")

    async def _sweep(self, writers: list[str]) -> None:
        for writer in writers:
            try:
                forgotten = await asyncio.to_thread(self.services("rules").memory.forget_unrecorded, writer)
            except Exception as exc:  # noqa: BLE001 - memory is advice: the next look tries again
                log.warning("daemon.sweep_waiting", writer=writer, error=f"{type(exc).__name__}: {exc}"[:300])
                continue
            self._unswept.discard(writer)
            log.info("daemon.swept", writer=writer, forgotten=forgotten)

    async def _cancel_wanted(self) -> None:
        wanted = await asyncio.to_thread(self.queue.wanted_cancelled)
        for job_id in wanted & set(self.running):
            task = self.running[job_id]
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await asyncio.to_thread(self.claims.finish, job_id, "cancelled", None, "cancelled by request")
            log.info("daemon.job_cancelled", job=job_id)

    async def _keep_leases(self) -> None:
        """Renew the leases of the running jobs (at most every third of a lease); a job another daemon
        took over meanwhile (this one stalled past its lease) is stopped here without writing to it."""
        now = time.monotonic()
        if now - self._renewed_at < self.lease_s / 3:
            return
        self._renewed_at = now
        lost = await asyncio.to_thread(self.claims.renew, set(self.running))
        for job_id in lost & set(self.running):
            task = self.running[job_id]
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            log.warning("daemon.lease_lost", job=job_id, owner=self.claims.owner)

    # -- lifetime ---------------------------------------------------------------------------------

    def request_stop(self) -> None:
        self._stop.set()

    def warm_up(self, services: Services) -> None:
        """What a daemon's first job would otherwise wait for: the rules brain's modules, the memory (the Chroma
        server's connection), the evaluator's sandbox when the daemon judges its own jobs, and JAX's backend
        and compiler."""
        import importlib

        import jax
        import jax.numpy as jnp

        importlib.import_module("actors.brains.rules")
        opened = services.memory  # the Chroma server's connection (waited for while it restarts)
        log.debug("daemon.memory_opened", memory=type(opened).__name__)
        if self.link is None:
            pool = services.evaluator.pool
            pool.release(pool.acquire())
        jax.jit(lambda x: x * 2 + 1)(jnp.ones(8)).block_until_ready()

    def _write_state(self, path: Path, port: int) -> None:
        state = DaemonState(pid=os.getpid(), port=port, concurrency=self.concurrency, started_at=self.started_at,
                            standby=self.standby)
        path.write_text(state.model_dump_json())

    async def serve(self) -> None:
        services = self.services("rules")
        self.queue = JobQueue(services.store.engine)
        self.claims = Claimer(self.queue, lease_s=self.lease_s)
        if not self.standby:
            await self._take_over_dead()
        from orchestrators.dashboard import Dashboard

        api = ApiServer(self.queue, self.status, self.port,
                        pages=Dashboard(self.queue, services.store, self.settings.data_path),
                        host=self.bind, token=self.settings.token)
        if self.link is not None:
            try:
                await self.link.open()
            except FleetUnreachable:
                api.httpd.server_close()
                raise
        api.start()
        path = state_path(self.settings)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        try:
            if self.standby:
                await asyncio.to_thread(self.warm_up, services)
                self._write_state(path, api.port)
                print("standby", flush=True)
                log.info("daemon.standby", pid=os.getpid(), port=api.port)
                if not await promoted_or_stopped(stop=self._stop):
                    return
                self.standby = False
                await self._take_over_dead()  # the dead daemon's jobs, before queued ones
            self._write_state(path, api.port)
            print("ready daemon", flush=True)
            log.info("daemon.started", pid=os.getpid(), port=api.port, concurrency=self.concurrency)
            while not self._stop.is_set():
                await self._keep_leases()
                await self._look_for_dead()
                await self._cancel_wanted()
                await self._fill()
                try:
                    await asyncio.wait_for(self._stop.wait(), self.poll_s)
                except asyncio.TimeoutError:
                    pass
        finally:
            await self.shutdown(api, path)

    async def shutdown(self, api: ApiServer, path: Path) -> None:
        """Cancel running jobs and queue them again, then close everything the daemon opened."""
        interrupted = list(self.running.items())
        for _job_id, task in interrupted:
            task.cancel()
        await asyncio.gather(*(t for _, t in interrupted), return_exceptions=True)
        for job_id, _task in interrupted:
            await asyncio.to_thread(self.claims.release, job_id)
        api.stop()
        for brain in sorted(self._services, key=lambda b: b == "rules"):  # the owner of the shared parts last
            await self._services[brain].aclose()
        if self.link is not None:
            await self.link.close()
        try:
            if json.loads(path.read_text()).get("pid") == os.getpid():
                path.unlink()
        except (OSError, ValueError):
            pass
        log.info("daemon.stopped", requeued=[j for j, _ in interrupted])


def main(argv: list[str] | None = None) -> int:
    arm()  # first of all: a spare may be promoted while it still imports
    parser = argparse.ArgumentParser(prog="python -m orchestrators.daemon")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--poll", type=float, default=0.5)
    parser.add_argument("--lease", type=float, default=DEFAULT_LEASE_S)
    parser.add_argument("--testers", help="gRPC host of the fleet's tester workers (default: judge in this process)")
    parser.add_argument("--bind", default="127.0.0.1", help="address of the HTTP API (beyond loopback: needs a token)")
    parser.add_argument("--standby", action="store_true", help="get ready, then claim jobs only when sent SIGUSR1")
    parser.add_argument("--supervise", action="store_true",
                        help="keep --count daemons alive (each in <data dir>/daemons/<n>), replacing any that dies")
    parser.add_argument("--count", type=int, help="daemons kept alive under --supervise (default 1)")
    parser.add_argument("--spares", type=int, help="standby daemons kept warm under --supervise, each taking a "
                                                   "dead daemon's place at once (default 0)")
    args = parser.parse_args(argv)
    if not args.supervise and (args.count is not None or args.spares is not None):
        parser.error("--count and --spares only with --supervise")
    if args.supervise and (args.standby or args.port):
        parser.error("--standby and --port not with --supervise (its spares stand by; each daemon takes a free port)")
    args.count, args.spares = (1 if args.count is None else args.count), (0 if args.spares is None else args.spares)
    if args.count < 1 or args.spares < 0 or args.concurrency < 1:
        parser.error("--count and --concurrency must be at least 1, --spares at least 0")
    from maxkernel.logging import configure

    configure(os.environ.get("MAXKERNEL_LOG_LEVEL", "info"))
    settings = load_settings()
    if args.supervise:
        return supervise(settings, args)
    if read_state(settings) is not None:
        print(f"error: a daemon is already running for {settings.data_path}", file=sys.stderr)
        return 2
    from maxkernel.compile_cache import use_compile_cache

    use_compile_cache(settings.cache_path / "jax")
    try:
        asyncio.run(Daemon(settings, concurrency=args.concurrency, port=args.port, poll_s=args.poll,
                           lease_s=args.lease, testers=args.testers, bind=args.bind, standby=args.standby).serve())
    except (BindRefused, FleetUnreachable) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def supervise(settings: Settings, args: argparse.Namespace) -> int:
    """Keep ``args.count`` daemons and ``args.spares`` standby daemons alive, each process in a fresh data folder
    ``<data dir>/daemons/<n>`` (a daemon's state file and layer outputs are its own; the store is shared, and so
    are the caches of the supervisor's ``cache_dir``: a daemon started in a dead one's place starts warm)."""
    from actors.supervisor import Supervisor

    base, cache = settings.data_path / "daemons", settings.cache_path

    def data_dir(n: int) -> dict[str, str]:
        folder = base / str(n)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / STATE_FILE).unlink(missing_ok=True)
        return {"MAXKERNEL_DATA_DIR": str(folder), "MAXKERNEL_CACHE_DIR": str(cache)}

    daemon_args = ["--concurrency", str(args.concurrency), "--poll", str(args.poll), "--lease", str(args.lease),
                   "--bind", args.bind, *(["--testers", args.testers] if args.testers else [])]
    return Supervisor(daemon_args, args.count, spares=args.spares, module="orchestrators.daemon",
                      env_for=data_dir).run()


def spawn(settings: Settings, *, concurrency: int = 2, port: int = 0, wait_s: float = 120.0) -> DaemonState:
    """Start a detached daemon process and wait until its API answers."""
    import subprocess
    import urllib.request

    log_path = settings.data_path / "daemon.log"
    start = log_path.stat().st_size if log_path.exists() else 0
    with log_path.open("ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "orchestrators.daemon", "--concurrency", str(concurrency),
                                 "--port", str(port)], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, cwd=str(Path(__file__).resolve().parent.parent))
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the daemon exited with code {proc.returncode}{_last_words(log_path, start)}; "
                               f"see {log_path}")
        state = read_state(settings)
        if state is not None and state.pid == proc.pid:
            try:
                probe = urllib.request.Request(f"http://127.0.0.1:{state.port}/status",
                                               headers=auth_headers(settings.token))
                urllib.request.urlopen(probe, timeout=5).read()
                return state
            except OSError:
                pass
        time.sleep(0.2)
    raise RuntimeError(f"the daemon did not answer within {wait_s:.0f} s; see {log_path}")


def _last_words(log_path: Path, start: int) -> str:
    """The last line this start wrote to the log (a traceback's own last line names its error), as ": line"."""
    with log_path.open("rb") as log:
        log.seek(start)
        lines = [line.strip() for line in log.read().decode(errors="replace").splitlines() if line.strip()]
    return f": {lines[-1][:300]}" if lines else ""


def stop(settings: Settings, wait_s: float = 120.0) -> int | None:
    """SIGTERM the running daemon and wait for it to exit; returns its pid, or None when none runs."""
    state = read_state(settings)
    if state is None:
        return None
    os.kill(state.pid, signal.SIGTERM)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            os.kill(state.pid, 0)
        except ProcessLookupError:
            return state.pid
        try:  # our own child (tests): reap it so that it does not linger as a zombie
            if os.waitpid(state.pid, os.WNOHANG)[0] == state.pid:
                return state.pid
        except ChildProcessError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"daemon {state.pid} did not stop within {wait_s:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
