"""A fork server: one process that has imported a program once forks every process of it that its owner starts.

A process that must import Python's modules, JAX and the rest before it can serve spends seconds of CPU that,
on a loaded machine, are taken from the work the live processes do: a dead tester worker or daemon replaced by
its supervisor (``actors.supervisor``), or an evaluator sandbox worker started by the judge's pool
(``jaxbench.pool``: about 1.6 s of CPU each, 1.5 s of it imports). The zygote pays those imports once, when
its owner starts it; each process it forks starts with them done and only opens what is its own (store,
memory, sandbox, connection). It imports nothing that opens connections or starts Python threads (JAX's
backend, gRPC's core and every client are opened after the fork, in the child); the native threads its
imports start are OpenBLAS's pools (numpy's, and scipy's for the daemon's learned cost model), which re-form
themselves after a fork. It reports how many threads it has (``threads``) for that reason. A zygote runs no
code but its program's imports: an evaluator worker's candidate runs only in the forked child, which sets up
its own sandbox as a worker started afresh does.

    owner --(socketpair, SOCK_SEQPACKET)--> python -m jaxbench.zygote MODULE FD

The owner sends one request per process (JSON: arguments, environment, working folder, and where each file
descriptor sent with it by SCM_RIGHTS goes: onto a standard stream (1: stdout, 2: stderr), or kept, its number
then put in the arguments in place of ``{fd<i>}``); the zygote answers ``{"pid": N}`` and, once the child is
reaped, ``{"exited": N, "code": C}`` (a negative code: the signal that killed it). A child runs
``MODULE.main(args)`` in a session of its own (its process group, as ``start_new_session`` gave it), with
SIGUSR1 held back until the program arms it (``actors.standby``) and SIGTERM sent to it if the zygote dies.
The zygote ignores SIGTERM and SIGINT (a fleet stopped by process group must not orphan the exit codes its
supervisor waits for): it ends when its owner closes the socket, or dies (the socket closes with it). Its own
environment is the one it was started with (``Zygote(env=...)``): what a process reads once at its start,
such as glibc's allocator settings, is the zygote's and so every child's.
"""

from __future__ import annotations

import importlib
import json
import os
import select
import signal
import socket
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, TextIO

ROOT = Path(__file__).resolve().parent.parent
MAX_REQUEST = 1 << 20  # one request: arguments and an environment
MAX_FDS = 8  # descriptors sent with one request


def _prctl_deathsig(sig: int) -> None:
    """``sig`` to this process when its parent dies (Linux's PR_SET_PDEATHSIG)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, sig)


# -- the zygote's side -------------------------------------------------------------------------------


def preload(module: str) -> Any:
    """Import ``module`` and what its process imports before it serves (its ``PRELOAD`` names)."""
    program = importlib.import_module(module)
    for name in getattr(program, "PRELOAD", ()):
        importlib.import_module(name)
    return program


def _place(fds: list[int], targets: list[int | None]) -> dict[int, int]:
    """Put each received descriptor where the request says: ``fds[i]`` onto ``targets[i]`` (a standard stream),
    or left where it is when the target is None. Returns ``{i: number}`` of those left."""
    kept: dict[int, int] = {}
    for i, (fd, target) in enumerate(zip(fds, targets)):
        if target is None:
            kept[i] = fd
        else:
            os.dup2(fd, target)
            os.close(fd)
    return kept


def _child(program: Any, request: dict[str, Any], fds: list[int], sock: socket.socket) -> int:
    """In the forked child: become the program's process and run its ``main``; its exit code (the child then
    leaves the zygote's loop and exits as any interpreter does, its exit handlers run)."""
    sock.close()
    os.setsid()
    _prctl_deathsig(signal.SIGTERM)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    kept = _place(fds, request.get("targets", [1]))
    args = [str(a).format(**{f"fd{i}": fd for i, fd in kept.items()}) if "{fd" in str(a) else a
            for a in request["args"]]
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request.get("cwd") or ROOT)
    sys.argv = [request["module"], *args]
    try:
        code = program.main(list(args))
    except SystemExit as exc:
        code = exc.code
    except BaseException:  # noqa: BLE001 - the child's last word, then its exit
        traceback.print_exc()
        return 1
    return code if isinstance(code, int) else (0 if code is None else 1)


def _reap(sock: socket.socket) -> None:
    """Report every child that exited."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        sock.send(json.dumps({"exited": pid, "code": code}).encode())


def serve(module: str, fd: int) -> int:
    """Preload ``module``, then fork a process of it for every request until the socket closes; returns the
    zygote's exit code, or, in a forked child, the child's. It ends when the socket closes, which is also how
    it sees its owner die (a parent-death signal would fire when the owner's thread that started it ends)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})  # every child inherits it held back
    sock = socket.socket(fileno=fd)
    program = preload(module)
    threads = len(os.listdir("/proc/self/task")) if Path("/proc/self/task").exists() else threading.active_count()
    sock.send(json.dumps({"ready": os.getpid(), "threads": threads}).encode())
    while True:
        readable, _, _ = select.select([sock], [], [], 0.02)
        try:
            _reap(sock)
            if not readable:
                continue
            data, fds, _flags, _addr = socket.recv_fds(sock, MAX_REQUEST, MAX_FDS)
        except (BrokenPipeError, ConnectionResetError):  # the owner closed its end while a child was reported
            return 0
        if not data:  # the owner is gone or done
            return 0
        request = json.loads(data)
        pid = os.fork()
        if pid == 0:
            return _child(program, request, fds, sock)
        for fd in fds:
            os.close(fd)
        try:
            sock.send(json.dumps({"pid": pid}).encode())
        except (BrokenPipeError, ConnectionResetError):  # the owner left meanwhile; the child dies with us
            return 0


# -- the supervisor's side ---------------------------------------------------------------------------


class Forked:
    """A process the zygote forked, with the part of ``subprocess.Popen`` its owner uses."""

    def __init__(self, pid: int, stdout: TextIO | None = None) -> None:
        self.pid, self.stdout = pid, stdout
        self.returncode: int | None = None
        self._exited = threading.Event()

    def _ended(self, code: int) -> None:
        self.returncode = code
        self._exited.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        import subprocess

        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired([str(self.pid)], timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class ZygoteGone(RuntimeError):
    """The fork server exited (killed, or failed to import its program)."""


class Zygote:
    """The owner's handle on its fork server: ``spawn`` and ``start`` return a ``Forked`` at once, its imports
    done. ``env`` is the zygote's own environment (default: the owner's)."""

    def __init__(self, module: str, *, start_timeout_s: float = 300.0, env: dict[str, str] | None = None) -> None:
        import subprocess

        self.module = module
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.proc = subprocess.Popen([sys.executable, "-m", "jaxbench.zygote", module, str(theirs.fileno())],
                                     cwd=str(ROOT), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     pass_fds=(theirs.fileno(),), env=env)
        theirs.close()
        self.sock = ours
        self.children: dict[int, Forked] = {}
        self._pids: list[int] = []
        self._early: dict[int, int] = {}  # children that exited before their handle was made
        self._answered = threading.Condition()
        self._spawning = threading.Lock()
        self._gone = False
        ready = self._read(start_timeout_s)
        if ready is None or "ready" not in ready:
            self.close()
            raise ZygoteGone(f"the fork server of {module} did not start (exit code {self.proc.poll()})")
        self.threads = int(ready.get("threads", 0))  # threads its imports started: OpenBLAS's pools at most
        threading.Thread(target=self._listen, daemon=True, name=f"zygote-{module}").start()

    def _read(self, timeout_s: float) -> dict[str, Any] | None:
        readable, _, _ = select.select([self.sock], [], [], timeout_s)
        if not readable:
            return None
        data = self.sock.recv(MAX_REQUEST)
        return json.loads(data) if data else None

    def _listen(self) -> None:
        while True:
            try:
                data = self.sock.recv(MAX_REQUEST)
            except OSError:
                data = b""
            if not data:
                break
            message = json.loads(data)
            with self._answered:
                if "pid" in message:
                    self._pids.append(message["pid"])
                    self._answered.notify_all()
                elif "exited" in message:
                    child = self.children.pop(message["exited"], None)
                    if child is not None:
                        child._ended(message["code"])
                    else:
                        self._early[message["exited"]] = message["code"]
        with self._answered:  # the zygote is gone: its children were sent SIGTERM; none of them is watched now
            self._gone = True
            self._answered.notify_all()
            for child in self.children.values():
                _kill_group(child.pid)
                child._ended(-signal.SIGKILL)
            self.children.clear()

    @property
    def alive(self) -> bool:
        return not self._gone and self.proc.poll() is None

    def spawn(self, args: list[str], env: dict[str, str], timeout_s: float = 30.0) -> Forked:
        """Fork a process of the program running ``main(args)`` with ``env``; its stdout is the returned pipe."""
        read_fd, write_fd = os.pipe()
        try:
            child = self.start(args, env, fds=[(write_fd, 1)], timeout_s=timeout_s)
        except ZygoteGone:
            os.close(read_fd)
            raise
        child.stdout = os.fdopen(read_fd, "r")
        return child

    def start(self, args: list[str], env: dict[str, str], *, fds: list[tuple[int, int | None]], cwd: str | None = None,
              timeout_s: float = 30.0) -> Forked:
        """Fork a process of the program running ``main(args)`` with ``env`` in ``cwd`` (default: the
        repository), given the descriptors ``fds``: each ``(fd, 1 or 2)`` becomes its stdout or stderr, each
        ``(fd, None)`` is kept, its number put in ``args`` for ``{fd<i>}`` (``i``: its place in ``fds``). The
        caller's descriptors stay open: it closes its copies."""
        request = json.dumps({"module": self.module, "args": args, "env": env, "cwd": cwd or str(ROOT),
                              "targets": [target for _, target in fds]}).encode()
        with self._spawning:
            try:
                socket.send_fds(self.sock, [request], [fd for fd, _ in fds])
            except OSError as exc:
                raise ZygoteGone(f"the fork server of {self.module} is gone: {exc}") from exc
            deadline = time.monotonic() + timeout_s
            with self._answered:
                while not self._pids and not self._gone and time.monotonic() < deadline:
                    self._answered.wait(0.1)
                if not self._pids:
                    raise ZygoteGone(f"the fork server of {self.module} did not fork")
                child = Forked(self._pids.pop(0))
                if child.pid in self._early:
                    child._ended(self._early.pop(child.pid))
                else:
                    self.children[child.pid] = child
        return child

    def close(self) -> None:
        """Close the socket (the zygote exits) and reap it."""
        import subprocess

        try:  # shutdown first: a close alone would wait for the listening thread's recv to return
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or not args[1].isdigit():
        print("usage: python -m jaxbench.zygote MODULE FD (started by its owner: actors.supervisor, jaxbench.pool)",
              file=sys.stderr)
        return 2
    return serve(args[0], int(args[1]))


if __name__ == "__main__":
    sys.exit(main())
