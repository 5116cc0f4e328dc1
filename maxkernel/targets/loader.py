"""Loading a candidate's source text into a fresh module, and finding the candidate line of a traced equation."""

from __future__ import annotations

import hashlib
import itertools
from types import ModuleType
from typing import TYPE_CHECKING

from jaxbench.candidate import CandidateError
from jaxbench.candidate import load_candidate as jaxbench_load
from maxkernel.targets.names import TargetError

if TYPE_CHECKING:
    from jax._src import core

_serial = itertools.count()


class CandidateLoadError(TargetError):
    """The candidate source does not import, or defines no callable ``kernel``."""

    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(message)
        self.line = line


def candidate_filename(source: str) -> str:
    """The pseudo file name a candidate's code objects carry; tracebacks are matched against it."""
    return f"<candidate-{hashlib.sha256(source.encode()).hexdigest()[:12]}>"


def load_candidate(source: str) -> ModuleType:
    """Load ``source`` with JaxBench's loader (:func:`jaxbench.candidate.load_candidate`) as a new module named
    after :func:`candidate_filename`, so tracebacks and JAX's source locations point into the candidate.
    Every call gives a new module."""
    filename = candidate_filename(source)
    name = f"maxkernel_candidate_{filename[11:-1]}_{next(_serial)}"
    try:
        return jaxbench_load(source, filename, name).module
    except CandidateError as exc:
        if exc.line is None and not exc.reason.startswith("module failed"):  # no kernel, or not a function
            raise CandidateLoadError("candidate does not define a callable kernel()") from exc
        where = f"candidate line {exc.line}: " if exc.line else "candidate: "
        cause = exc.reason.split(": ", 1)[-1]  # "Type: message" (a syntax error's own message)
        what = "SyntaxError: " if exc.reason.startswith("syntax error") else "import failed: "
        raise CandidateLoadError(f"{where}{what}{cause}", exc.line) from exc


def eqn_line(eqn: "core.JaxprEqn", filename: str) -> int | None:
    """The candidate line that created an equation (innermost candidate frame of its traceback)."""
    traceback = eqn.source_info.traceback
    for frame in getattr(traceback, "frames", []) if traceback is not None else []:
        if frame.file_name == filename:
            return int(frame.line_num)
    return None
