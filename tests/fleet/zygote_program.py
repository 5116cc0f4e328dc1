"""A small program for the zygote's test: says what it was given and where it was imported, then exits or waits."""

from __future__ import annotations

import os
import signal
import time

IMPORTED_BY = os.getpid()  # the process that ran this module's imports
PRELOAD = ("json",)


def main(argv: list[str]) -> int:
    held = signal.SIGUSR1 in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    print(f"pid={os.getpid()} imported_by={IMPORTED_BY} session={os.getsid(0)} usr1_held={held} "
          f"env={os.environ.get('ZYGOTE_TEST', '')} args={','.join(argv)}", flush=True)
    if argv[:1] == ["wait"]:
        time.sleep(120)
    return int(argv[1]) if len(argv) > 1 else 0
