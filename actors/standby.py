"""Warm spares: a process that gets everything ready, then waits for SIGUSR1 before it serves.

A supervisor (``actors.supervisor``) starts its spares with SIGUSR1 blocked, so that a promotion sent while
the spare still imports is held back until ``arm()`` has installed the handler (the signal's default action
would kill it); the promotion is then seen at once. Tester workers and daemons both wait this way.
"""

from __future__ import annotations

import asyncio
import signal
import threading

PROMOTED = threading.Event()  # SIGUSR1 seen: a spare is to start serving


def _promote(_sig: int, _frame: object) -> None:
    PROMOTED.set()


def arm() -> None:
    """First of all in a process that may be a spare: note SIGUSR1, and let through one held back meanwhile."""
    signal.signal(signal.SIGUSR1, _promote)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})


async def promoted_or_stopped(poll_s: float = 0.05, stop: asyncio.Event | None = None) -> bool:
    """Wait for SIGUSR1 (True) or for ``stop`` (False); without ``stop``, SIGTERM/SIGINT stop the wait."""
    loop = asyncio.get_running_loop()
    ours = stop is None
    stop = stop or asyncio.Event()
    if ours:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
    try:
        while not PROMOTED.is_set():
            if stop.is_set():
                return False
            await asyncio.sleep(poll_s)
        return True
    finally:
        if ours:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
