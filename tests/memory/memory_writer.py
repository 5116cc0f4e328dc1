"""A separate process writing to a store, for the concurrency test.

Usage: python memory_writer.py URL TAG N GO_FILE. Prints "ready" once imported, waits for GO_FILE
so that all writers start together, then opens the store (migrating it if it is new) and writes
N events, one transaction each, plus a candidate and a note every tenth event.
"""

import logging
import sys
import time
from pathlib import Path

import structlog

from memory.models import EventIn
from memory.store import Store


def main() -> None:
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
    )
    url, tag, count, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
    print("ready", flush=True)
    while not go.exists():
        time.sleep(0.01)
    with Store.open(url) as store:
        for i in range(count):
            store.append_events([EventIn(message_type="Tick", payload={"writer": tag, "i": i}, session_id=tag)])
            if i % 10 == 0:
                store.add_candidate(f"task_{tag}", f"def kernel(x):\n    return x  # {tag} {i}\n", session_id=tag)
                store.add_note(f"{tag} note {i}", task_id="shared_task")
    print("done", flush=True)


if __name__ == "__main__":
    main()
