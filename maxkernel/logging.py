"""structlog set-up: readable lines on a terminal, JSON lines otherwise."""

from __future__ import annotations

import logging
import sys

import structlog


class _CurrentStderr:
    """Writes to whatever ``sys.stderr`` is at the moment of writing, so that loggers cached while a
    test runner (or a daemon's redirect) swapped the stream never write into a closed one."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def configure(level: str = "info", *, cache: bool = True) -> None:
    renderer = structlog.dev.ConsoleRenderer() if sys.stderr.isatty() else structlog.processors.JSONRenderer()
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper(), logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(file=_CurrentStderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=cache,
    )


def configure_quiet_default() -> None:
    """Where nothing configured logging (a library user's ``import maxkernel``), warnings and errors only, on
    stderr: structlog's own default prints every debug line to stdout, into the user's program's output."""
    if not structlog.is_configured():
        configure("warning", cache=False)  # not cached: a later configure (the CLI's --log-level) still applies


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    return structlog.get_logger(name)
