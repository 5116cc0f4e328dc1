"""Turning source text into a module as Python imports a file: candidates (their ``kernel``) and tasks' references."""

from __future__ import annotations

import hashlib
import inspect
import linecache
import sys
import types
from dataclasses import dataclass
from typing import Any, Callable


class CandidateError(Exception):
    """The candidate cannot be loaded; ``status`` is the report status it earns, ``line`` where it failed."""

    def __init__(self, status: str, reason: str, line: int | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.line = line


@dataclass
class LoadedCandidate:
    module: types.ModuleType
    kernel: Callable[..., Any]
    sha: str


def source_sha(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def compile_source(source: str, filename: str) -> types.CodeType:
    try:
        return compile(source, filename, "exec", dont_inherit=True)
    except SyntaxError as exc:
        raise CandidateError("compile_error", f"syntax error at line {exc.lineno}: {exc.msg}", exc.lineno) from exc
    except ValueError as exc:  # e.g. null bytes
        raise CandidateError("compile_error", f"source cannot be compiled: {exc}") from exc


def load_module(source: str, filename: str, module_name: str) -> types.ModuleType:
    """Execute ``source`` as the module ``module_name``, as Python imports a file: registered in
    ``sys.modules`` while it runs (dataclasses and ``from __future__ import annotations`` look the module up
    there) and its lines known to ``linecache`` (tracebacks and JAX's source locations show them).

    The one loader for candidates and for tasks' ``reference.py``. Raises ``CandidateError`` (status
    ``compile_error``, with the line) when the source does not compile or import; the module is then
    unregistered."""
    code = compile_source(source, filename)
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    module = types.ModuleType(module_name)
    module.__file__ = filename
    sys.modules[module_name] = module
    try:
        exec(code, module.__dict__)
    except Exception as exc:
        sys.modules.pop(module_name, None)
        line = _source_line(exc, filename)
        where = f" (line {line})" if line else ""
        raise CandidateError("compile_error",
                             f"module failed to import{where}: {type(exc).__name__}: {exc}", line) from exc
    return module


def unload_module(module: types.ModuleType) -> None:
    """Forget a module :func:`load_module` registered (the next candidate must not find it)."""
    if sys.modules.get(module.__name__) is module:
        del sys.modules[module.__name__]


def load_candidate(source: str, filename: str = "<candidate>", module_name: str | None = None) -> LoadedCandidate:
    """Load the source with :func:`load_module` and fetch its ``kernel``."""
    sha = source_sha(source)
    module = load_module(source, filename, module_name or f"candidate_{sha}")
    kernel = module.__dict__.get("kernel")
    if kernel is None or not callable(kernel):
        unload_module(module)
        if kernel is None:
            raise CandidateError("compile_error", "the candidate defines no kernel()")
        raise CandidateError("compile_error", f"kernel is a {type(kernel).__name__}, not a function")
    return LoadedCandidate(module, kernel, sha)


def _source_line(exc: BaseException, filename: str) -> int | None:
    """The innermost line of ``filename`` in the exception's traceback (a syntax error's own line)."""
    if isinstance(exc, SyntaxError) and exc.filename == filename:
        return exc.lineno
    line, tb = None, exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == filename:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def check_signature(kernel: Callable[..., Any], n_args: int, static: dict[str, Any]) -> str | None:
    """Why ``kernel(*args, **static)`` cannot bind, or None when it can."""
    try:
        sig = inspect.signature(kernel)
    except (TypeError, ValueError):
        return None  # builtins and some wrappers hide their signature; the call itself will tell
    try:
        sig.bind(*([None] * n_args), **static)
    except TypeError as exc:
        return f"wrong signature: kernel{sig} cannot take {n_args} positional args and {sorted(static)}: {exc}"
    return None
