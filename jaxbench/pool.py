"""A pool of persistent candidate workers, owned by the judge.

A worker that overruns its deadline, dies, or sends a malformed message is killed with its whole process
group and replaced; the caller only ever sees a status and a reason.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

from jaxbench import wire
from jaxbench.zygote import Forked, Zygote, ZygoteGone

STARTUP_TIMEOUT_S = 120.0

# glibc's allocator, fixed alike in every worker. By default glibc maps a block of 32 MiB or more afresh and
# unmaps it when freed, and whether a call's buffers come from the heap instead (no fresh page to fault in)
# depends on everything the process ran before: the reference run as a candidate read 2.5x on 12p and 1.8x
# on 2p in a suite run, after other tasks' candidates had grown the candidate worker's heap. With mmap off,
# one arena for every thread and a heap that is never trimmed back, every buffer comes from the heap, a
# freed one is reused by the next call, and both workers settle within the warm-up at the same state: no
# fresh pages per call, which is also how an accelerator's pooled allocator serves a kernel's buffers.
ALLOCATOR_ENV = {
    "MALLOC_MMAP_THRESHOLD_": str(32 << 20),
    "MALLOC_TRIM_THRESHOLD_": str(1 << 30),
    "MALLOC_TOP_PAD_": str(16 << 20),
    "MALLOC_MMAP_MAX_": "0",
    "MALLOC_ARENA_MAX": "1",
}


FORK_SERVER_ENV = "JAXBENCH_FORK_SERVER"  # 0: every worker started afresh (see WorkerPool)
CPUS_ENV = "JAXBENCH_WORKER_CPUS"  # the cores a worker pins itself to before JAX starts its threads


def worker_env(alike: bool = True, cpus: tuple[int, ...] | None = None) -> dict[str, str]:
    """The environment of a worker process: the judge's, with ``ALLOCATOR_ENV`` when ``alike`` (the
    default; ``alike=False`` keeps whatever allocator settings the judge's environment has), and the cores
    to pin itself to when ``cpus`` names some; never JAX's persistent compilation cache."""
    env = dict(os.environ)
    env.setdefault("JAX_PLATFORMS", "cpu")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.pop(CPUS_ENV, None)
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # a worker compiles afresh, never from a cache others can write
    if alike:
        env.update(ALLOCATOR_ENV)
    if cpus:
        env[CPUS_ENV] = ",".join(str(c) for c in sorted(cpus))
    return env


def one_core() -> tuple[int, ...]:
    """The last core this process may run on (read, never assumed): both timing workers pinned to it."""
    return (max(os.sched_getaffinity(0)),)


class WorkerFailure(Exception):
    """The worker could not answer; ``status`` is the report status this earns the candidate."""

    def __init__(self, status: str, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class WorkerHandle:
    """One worker process and its pipes: forked by ``zygote`` when one is given (its imports done there),
    else started afresh; either way in a session of its own, its sandbox set up by itself."""

    def __init__(self, memory_bytes: int, alike: bool = True, cpus: tuple[int, ...] | None = None,
                 zygote: Zygote | None = None) -> None:
        self.memory_bytes = memory_bytes
        self.alike = alike
        self.cpus = cpus
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        env = worker_env(alike, cpus)
        self.proc: subprocess.Popen[bytes] | Forked
        if zygote is not None:
            stderr_r, stderr_w = os.pipe()
            try:
                self.proc = zygote.start(["{fd0}", "{fd1}", str(memory_bytes)], env, cwd="/",
                                         fds=[(to_child_r, None), (from_child_w, None), (stderr_w, 2)])
            except BaseException:
                for fd in (to_child_r, to_child_w, from_child_r, from_child_w, stderr_r):
                    os.close(fd)
                raise
            finally:
                os.close(stderr_w)
            stderr = os.fdopen(stderr_r, "rb")
        else:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "jaxbench.worker", str(to_child_r), str(from_child_w), str(memory_bytes)],
                pass_fds=(to_child_r, from_child_w),
                start_new_session=True,  # its own process group: a kill takes every child with it
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                env=env,
                cwd="/",
            )
            assert self.proc.stderr is not None
            stderr = self.proc.stderr
        os.close(to_child_r)
        os.close(from_child_w)
        self.pipes = wire.Duplex(Connection(from_child_r, writable=False), Connection(to_child_w, readable=False))
        self._stderr_tail: list[str] = []
        threading.Thread(target=self._drain_stderr, args=(stderr,), daemon=True).start()
        hello = self._receive(STARTUP_TIMEOUT_S)
        self.layers: dict[str, str] = hello.get("layers", {})

    def _drain_stderr(self, stderr: Any) -> None:
        with stderr:
            for line in iter(stderr.readline, b""):
                self._stderr_tail = (self._stderr_tail + [line.decode(errors="replace").rstrip()])[-20:]

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def request(self, message: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        self.send(message)
        return self._receive(timeout_s)

    def send(self, message: dict[str, Any]) -> None:
        """Send without waiting, so the judge can work while the worker does (see ``receive``)."""
        try:
            wire.send(self.pipes, message)
        except (BrokenPipeError, OSError) as exc:
            self.kill()
            raise WorkerFailure("runtime_error", f"worker died before the request: {exc}") from exc

    def receive(self, timeout_s: float) -> dict[str, Any]:
        return self._receive(timeout_s)

    def _receive(self, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.kill()
                raise WorkerFailure("timeout", f"no answer within {timeout_s:.0f} s wall-clock; worker killed")
            try:
                if self.pipes.poll(min(remaining, 0.5)):
                    reply = wire.recv(self.pipes)
                    if not isinstance(reply, dict):
                        raise wire.WireError("reply is not a mapping")
                    return reply
            except (EOFError, OSError):
                raise self._death() from None
            except wire.WireError as exc:
                self.kill()
                raise WorkerFailure("rejected", f"worker sent a malformed reply ({exc})") from exc
            if not self.alive:
                raise self._death()

    def _death(self) -> WorkerFailure:
        code = self.proc.wait(timeout=10) if self.proc.poll() is None else self.proc.returncode
        self.kill()
        tail = " | ".join(line for line in self._stderr_tail[-3:] if line)
        if code is not None and code < 0:
            sig = -code
            if sig == signal.SIGXCPU:
                return WorkerFailure("timeout", "CPU-time limit exceeded; worker killed")
            name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
            hint = " (likely the address-space limit)" if sig in (signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS) else ""
            return WorkerFailure("runtime_error", f"worker died by {name}{hint}" + (f": {tail}" if tail else ""))
        return WorkerFailure("runtime_error", f"worker exited with code {code}" + (f": {tail}" if tail else ""))

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self.pipes.close()

    def close(self) -> None:
        if self.alive:
            try:
                self.request({"op": "exit"}, timeout_s=5)
            except WorkerFailure:
                pass
        self.kill()


class WorkerPool:
    """``size`` persistent workers; ``acquire`` hands one out, replacing dead ones transparently.

    Workers are forked by the pool's fork server (``jaxbench.zygote``, started with the workers' environment
    on the first worker and again if it dies), so a worker replaced after a candidate killed it, or started
    by a fresh judge, does not import JAX again; ``fork_server=False`` (or ``JAXBENCH_FORK_SERVER=0``)
    starts each afresh, as does a pool whose fork server cannot start."""

    def __init__(self, size: int = 1, memory_bytes: int = 8 << 30, alike: bool = True,
                 cpus: tuple[int, ...] | None = None, fork_server: bool | None = None) -> None:
        self.size = max(1, size)
        self.memory_bytes = memory_bytes
        self.alike = alike  # every worker started with ALLOCATOR_ENV (see worker_env)
        self.cpus = cpus  # every worker pinned to these cores (None: wherever the judge may run)
        self.fork_server = os.environ.get(FORK_SERVER_ENV, "1") != "0" if fork_server is None else fork_server
        self._zygote: Zygote | None = None
        self._zygote_lock = threading.Lock()
        self._idle: list[WorkerHandle] = []
        self._lock = threading.Condition()
        self._started = 0
        self.replaced = 0

    def _server(self) -> Zygote | None:
        """The fork server, started (again) when needed; None when the pool starts workers afresh."""
        if not self.fork_server:
            return None
        with self._zygote_lock:
            if self._zygote is None or not self._zygote.alive:
                if self._zygote is not None:
                    self._zygote.close()
                try:
                    self._zygote = Zygote("jaxbench.worker", env=worker_env(self.alike),
                                          start_timeout_s=STARTUP_TIMEOUT_S)
                except (ZygoteGone, OSError):
                    self._zygote, self.fork_server = None, False  # this host cannot: start workers afresh
            return self._zygote

    def start_worker(self) -> WorkerHandle:
        """A new worker with the pool's settings (outside the pool's count: the judge's reference worker)."""
        zygote = self._server()
        try:
            return WorkerHandle(self.memory_bytes, self.alike, self.cpus, zygote=zygote)
        except ZygoteGone:  # it died between the check and the fork: once more, with a new one
            return WorkerHandle(self.memory_bytes, self.alike, self.cpus, zygote=self._server())

    def acquire(self) -> WorkerHandle:
        with self._lock:
            while not self._idle and self._started >= self.size:
                self._lock.wait()
            if self._idle:
                handle = self._idle.pop()
                if handle.alive:
                    return handle
                self._started -= 1
                self.replaced += 1
            self._started += 1
        try:
            return self.start_worker()
        except BaseException:
            with self._lock:
                self._started -= 1
                self._lock.notify()
            raise

    def release(self, handle: WorkerHandle) -> None:
        with self._lock:
            if handle.alive:
                self._idle.append(handle)
            else:
                self._started -= 1
                self.replaced += 1
            self._lock.notify()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
            self._started -= len(idle)
        for handle in idle:
            handle.close()
        with self._zygote_lock:
            if self._zygote is not None:
                self._zygote.close()
                self._zygote = None

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
