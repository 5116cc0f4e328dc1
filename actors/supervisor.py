"""Keeps N worker processes alive: a worker that dies (killed, crashed) is replaced at once.

    python -m actors.worker --supervise --count 3 --spares 1 --host 127.0.0.1:50051 --roles tester

Each worker runs in its own process group (so that its sandboxed evaluator processes go with it). With
``--spares S`` the supervisor also keeps S standby workers (``--standby``: imported, services and evaluator
sandbox started, connected, not registered): when a worker dies a spare is promoted into its slot (SIGUSR1;
it registers and serves within moments instead of the seconds a fresh Python, JAX and sandbox take) and a
new spare starts behind it; without a spare the slot is started afresh. It prints ``started <slot> <pid>``
for every fresh start, ``spare <pid>`` for every spare started, ``standby <pid>`` when a spare is warm,
``promoted <slot> <pid>`` when a spare takes a slot and ``ready <slot> <roles>`` when a slot's worker is
serving; SIGTERM stops the workers and then the supervisor. What a dead worker was doing is given to
another by the host (``actors.balancer``). The same supervisor keeps a fleet's daemons and their warm
standby daemons (``module="orchestrators.daemon"``, each process in a data folder of its own).

Every process, the first ones and every replacement, is forked by the supervisor's zygote
(``jaxbench.zygote``), which imported the program once: a replacement pays no imports, so the work of the
live processes is not slowed by the CPU a fresh interpreter would take (its own set-up, the store, the
sandbox, the connection, it still makes).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import structlog

from jaxbench.zygote import Forked, Zygote

log = structlog.get_logger("actors.supervisor")


class Supervisor:
    def __init__(self, worker_args: list[str], count: int, *, spares: int = 0, restart_delay_s: float = 0.5,
                 module: str = "actors.worker", env_for: Callable[[int], dict[str, str]] | None = None) -> None:
        """``module`` is the program each process runs (its ``main(worker_args)``, as ``python -m module
        *worker_args`` would); ``env_for(n)``, when given, adds to the environment of the ``n``-th process
        started (from 0)."""
        self.worker_args, self.count, self.spares, self.restart_delay_s = worker_args, count, spares, restart_delay_s
        self.module, self.env_for, self.spawned = module, env_for, 0
        self.procs: dict[int, Forked] = {}
        self.standby: list[Forked] = []
        self.zygote: Zygote | None = None
        self.restarts = 0
        self.promotions = 0
        self._stop = threading.Event()
        self._print = threading.Lock()

    def _say(self, line: str) -> None:
        with self._print:  # one write, line and newline together: the workers' logs share the file
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    def _spawn(self, *extra: str) -> Forked:
        """A new process of the program, forked by the zygote (its imports already done); a zygote that died
        is started again first."""
        env = {**os.environ, **(self.env_for(self.spawned) if self.env_for is not None else {})}
        self.spawned += 1
        if self.zygote is None or not self.zygote.alive:
            if self.zygote is not None:
                log.warning("supervisor.zygote_died", module=self.module)
                self.zygote.close()
            self.zygote = Zygote(self.module)
            log.info("supervisor.zygote_ready", module=self.module, pid=self.zygote.proc.pid, threads=self.zygote.threads)
        proc = self.zygote.spawn([*self.worker_args, *extra], env)
        threading.Thread(target=self._relay, args=(proc,), daemon=True).start()
        return proc

    def _start(self, slot: int) -> None:
        self.procs[slot] = self._spawn()
        self._say(f"started {slot} {self.procs[slot].pid}")

    def _start_spare(self) -> None:
        proc = self._spawn("--standby")
        self.standby.append(proc)
        self._say(f"spare {proc.pid}")

    def _replace(self, slot: int) -> None:
        """Put a spare in ``slot`` at once (and start another behind it), or start the slot afresh."""
        spare = next((p for p in self.standby if p.poll() is None), None)
        if spare is None:
            time.sleep(self.restart_delay_s)
            if not self._stop.is_set():
                self._start(slot)
            return
        self.standby.remove(spare)
        self.procs[slot] = spare
        spare.send_signal(signal.SIGUSR1)  # a spare still starting registers as soon as it is ready
        self.promotions += 1
        self._say(f"promoted {slot} {spare.pid}")
        self._start_spare()

    def _slot_of(self, proc: Forked) -> int | None:
        return next((slot for slot, p in self.procs.items() if p is proc), None)

    def _relay(self, proc: Forked) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.strip() == "standby":
                self._say(f"standby {proc.pid}")
            elif line.startswith("ready "):
                deadline = time.monotonic() + 5  # a promoted spare may answer before its slot is written
                while (slot := self._slot_of(proc)) is None and time.monotonic() < deadline:
                    time.sleep(0.01)
                self._say(f"ready {slot} {line.removeprefix('ready ').strip()}")

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop())
        for slot in range(self.count):
            self._start(slot)
        for _ in range(self.spares):
            self._start_spare()
        try:
            while not self._stop.wait(0.05):
                for slot, proc in list(self.procs.items()):
                    code = proc.poll()
                    if code is None:
                        continue
                    self.restarts += 1
                    log.warning("supervisor.worker_died", slot=slot, pid=proc.pid, code=code, restarts=self.restarts)
                    _kill_group(proc.pid, signal.SIGKILL)  # whatever it left behind (evaluator sandboxes)
                    if not self._stop.is_set():
                        self._replace(slot)
                for proc in [p for p in self.standby if p.poll() is not None]:
                    log.warning("supervisor.spare_died", pid=proc.pid, code=proc.returncode)
                    _kill_group(proc.pid, signal.SIGKILL)
                    self.standby.remove(proc)
                    if not self._stop.is_set():
                        self._start_spare()
        finally:
            everyone = [*self.procs.values(), *self.standby]
            for proc in everyone:
                if proc.poll() is None:
                    proc.terminate()
            deadline = time.monotonic() + 20
            for proc in everyone:
                try:
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    _kill_group(proc.pid, signal.SIGKILL)
            if self.zygote is not None:
                self.zygote.close()
        return 0


def _kill_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
