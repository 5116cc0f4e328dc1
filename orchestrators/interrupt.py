"""Running a session or a search so that Ctrl-C or SIGTERM ends it as *interrupted*, in the store and on screen.

``asyncio.run`` turns Ctrl-C into a cancellation of the main task, but SIGTERM kills the process before any
``finally`` runs (a search stayed ``running`` in the store for ever), and the runtime's own tasks, cancelled
at shutdown, print pages of tracebacks. ``run_interruptible`` cancels the main task on either signal, so the
orchestrators' cancellation paths record how the run ended, then ends what is left quietly and raises
``Interrupted``.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

INTERRUPTED = "interrupted"  # the status a session or search cut short by a signal is stored with


class Interrupted(KeyboardInterrupt):
    """The run was cut short by ``signum`` (after its state was recorded); a KeyboardInterrupt, as Ctrl-C is."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def run_interruptible(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)``, where SIGINT and SIGTERM cancel ``main`` and raise :class:`Interrupted` once it has
    unwound; tasks still pending then are cancelled without printing their errors."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    task = loop.create_task(main)
    received: list[int] = []

    runtime_log = logging.getLogger("autogen_core")
    level = runtime_log.level

    def on_signal(signum: int) -> None:
        received.append(signum)
        # the agents' runtime tasks cut off mid-message from here on: their errors are the interruption's echo
        loop.set_exception_handler(lambda _loop, _context: None)
        runtime_log.setLevel(logging.CRITICAL)
        task.cancel()

    handled = []
    for signum in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(signum, on_signal, signum)
            handled.append(signum)
        except (ValueError, RuntimeError):  # not the main thread: signals stay with whoever owns them
            pass
    try:
        return loop.run_until_complete(task)
    except asyncio.CancelledError:
        if received:
            raise Interrupted(received[0]) from None
        raise
    finally:
        for signum in handled:
            loop.remove_signal_handler(signum)
        try:
            _wind_down(loop)
        finally:
            runtime_log.setLevel(level)


def _wind_down(loop: asyncio.AbstractEventLoop) -> None:
    """What ``asyncio.run`` does at its end: cancel what is pending, close generators and the executor."""
    try:
        pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for t in pending:
            t.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.run_until_complete(loop.shutdown_default_executor())
    finally:
        asyncio.set_event_loop(None)
        loop.close()
