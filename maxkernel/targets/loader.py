"""Loading a candidate's source text into a fresh module, and finding the candidate line of a traced equation."""

from __future__ import annotations

import hashlib
import itertools
import linecache
import sys
from types import ModuleType
from typing import TYPE_CHECKING

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
    """Execute ``source`` as a new module and return it; it must define a callable ``kernel``.

    The code is compiled under :func:`candidate_filename` and its lines are registered with ``linecache``,
    so tracebacks and JAX's source locations point into the candidate. Every call gives a new module.
    """
    filename = candidate_filename(source)
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    name = f"maxkernel_candidate_{filename[11:-1]}_{next(_serial)}"
    module = ModuleType(name)
    module.__file__ = filename
    sys.modules[name] = module  # dataclasses and pickling look their module up here
    try:
        code = compile(source, filename, "exec")
        exec(code, module.__dict__)
    except SyntaxError as exc:
        del sys.modules[name]
        raise CandidateLoadError(f"candidate line {exc.lineno}: SyntaxError: {exc.msg}", exc.lineno) from exc
    except Exception as exc:
        del sys.modules[name]
        line = next((ln for fr, ln in _frames(exc) if fr.f_code.co_filename == filename), None)
        where = f"candidate line {line}: " if line else "candidate: "
        raise CandidateLoadError(f"{where}import failed: {type(exc).__name__}: {exc}", line) from exc
    if not callable(getattr(module, "kernel", None)):
        del sys.modules[name]
        raise CandidateLoadError("candidate does not define a callable kernel()")
    return module


def eqn_line(eqn: "core.JaxprEqn", filename: str) -> int | None:
    """The candidate line that created an equation (innermost candidate frame of its traceback)."""
    traceback = eqn.source_info.traceback
    for frame in getattr(traceback, "frames", []) if traceback is not None else []:
        if frame.file_name == filename:
            return int(frame.line_num)
    return None


def _frames(exc: BaseException):  # type: ignore[no-untyped-def]
    tb = exc.__traceback__
    while tb is not None:
        yield tb.tb_frame, tb.tb_lineno
        tb = tb.tb_next
