"""Keeps N worker processes alive: a worker that dies (killed, crashed) is started again.

    python -m actors.worker --supervise --count 3 --host 127.0.0.1:50051 --roles tester

Each worker runs in its own process group (so that its sandboxed evaluator processes go with it). The
supervisor prints ``started <slot> <pid>`` for every start and ``ready <slot> <roles>`` when that worker
is serving; SIGTERM stops the workers and then the supervisor. What a dead worker was doing is given to
another by the host (``actors.balancer``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import structlog

log = structlog.get_logger("actors.supervisor")

ROOT = Path(__file__).resolve().parent.parent


class Supervisor:
    def __init__(self, worker_args: list[str], count: int, *, restart_delay_s: float = 0.5) -> None:
        self.worker_args, self.count, self.restart_delay_s = worker_args, count, restart_delay_s
        self.procs: dict[int, subprocess.Popen[str]] = {}
        self.restarts = 0
        self._stop = threading.Event()
        self._print = threading.Lock()

    def _say(self, line: str) -> None:
        with self._print:
            print(line, flush=True)

    def _start(self, slot: int) -> None:
        proc = subprocess.Popen([sys.executable, "-m", "actors.worker", *self.worker_args], cwd=str(ROOT),
                                stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, start_new_session=True,
                                preexec_fn=_die_with_parent)
        self.procs[slot] = proc
        self._say(f"started {slot} {proc.pid}")
        threading.Thread(target=self._relay, args=(slot, proc), daemon=True).start()

    def _relay(self, slot: int, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("ready "):
                self._say(f"ready {slot} {line.removeprefix('ready ').strip()}")

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop())
        for slot in range(self.count):
            self._start(slot)
        try:
            while not self._stop.wait(0.2):
                for slot, proc in list(self.procs.items()):
                    code = proc.poll()
                    if code is None:
                        continue
                    self.restarts += 1
                    log.warning("supervisor.worker_died", slot=slot, pid=proc.pid, code=code, restarts=self.restarts)
                    _kill_group(proc.pid, signal.SIGKILL)  # whatever it left behind (evaluator sandboxes)
                    time.sleep(self.restart_delay_s)
                    if not self._stop.is_set():
                        self._start(slot)
        finally:
            for proc in self.procs.values():
                if proc.poll() is None:
                    proc.terminate()
            deadline = time.monotonic() + 20
            for proc in self.procs.values():
                try:
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    _kill_group(proc.pid, signal.SIGKILL)
                    proc.wait()
        return 0


def _die_with_parent() -> None:
    """In the child: SIGTERM when the supervisor dies, even by SIGKILL (Linux), so no worker is orphaned."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _kill_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
