"""Where the chaos benchmark's CPU went, per kind of process and per phase: on a host whose cores the fleet
fills, a phase's jobs per minute follow the CPU seconds its work took, so the seconds the phase with kills
spends beyond the calm one are what the kills cost (restarted processes warming up, work done again).

A thread samples every process descended from this one (the fleet's servers, daemons, tester workers and
their evaluator sandboxes) twice a second from ``/proc``: its kind, read from its command line, and its
CPU seconds so far. A phase's seconds of a kind are, over its processes, the last reading in the phase less
the last one before it (zero for a process started within it). A process killed between two samples loses
at most half a second of CPU from the account.
"""

from __future__ import annotations

import os
import threading
import time
from collections import defaultdict
from pathlib import Path

# Command-line marks of the fleet's processes, first match wins (a forked daemon or worker keeps its
# zygote's command line, which names the program it serves).
KINDS = (("jaxbench.worker", "evaluator sandbox"), ("orchestrators.daemon", "daemon"),
         ("actors.worker", "tester worker"), ("actors.host", "grpc host"), ("chroma", "chroma"),
         ("postgres", "postgres"))
TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def kind_of(command: str) -> str:
    """The kind of a process from its command line (``other`` for anything unknown)."""
    return next((kind for mark, kind in KINDS if mark in command), "other")


def _read(pid: str) -> tuple[int, str, float] | None:
    """``(ppid, command line, CPU seconds)`` of ``pid``, or None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()
    return int(fields[1]), command, (int(fields[11]) + int(fields[12])) / TICK


class CpuSampler:
    """Samples the CPU seconds of this process's descendants until stopped; ``seconds(start, end)`` per kind."""

    def __init__(self, every_s: float = 0.5, root: int | None = None) -> None:
        self.every_s, self.root = every_s, root or os.getpid()
        self.samples: list[tuple[float, dict[int, tuple[str, float]]]] = []
        self.kinds: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)

    def start(self) -> CpuSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def sample(self) -> None:
        seen = {pid: read for pid in os.listdir("/proc") if pid.isdigit() and (read := _read(pid)) is not None}
        parent = {int(pid): read[0] for pid, read in seen.items()}
        ours: dict[int, tuple[str, float]] = {}
        for pid, (_, command, cpu) in seen.items():
            node, hops = int(pid), 0
            while node not in (0, 1, self.root) and hops < 64:
                node, hops = parent.get(node, 0), hops + 1
            if node == self.root and int(pid) != self.root:
                if command:  # an exited process not yet reaped has none: keep the kind it had
                    self.kinds[int(pid)] = kind_of(command)
                ours[int(pid)] = (self.kinds.get(int(pid), "other"), cpu)
        self.samples.append((time.time(), ours))

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.every_s)

    def seconds(self, start: float, end: float) -> dict[str, float]:
        """CPU seconds per kind of process within ``[start, end]`` (unix seconds), most first."""
        before: dict[int, float] = {}
        last: dict[int, tuple[str, float]] = {}
        for moment, readings in self.samples:
            for pid, (kind, cpu) in readings.items():
                if moment <= start:
                    before[pid] = cpu
                elif moment <= end:
                    last[pid] = (kind, max(cpu, last.get(pid, (kind, 0.0))[1]))
        spent: dict[str, float] = defaultdict(float)
        for pid, (kind, cpu) in last.items():
            spent[kind] += cpu - before.get(pid, 0.0)
        return {kind: round(value, 1) for kind, value in sorted(spent.items(), key=lambda kv: -kv[1])}
