"""Turning candidate source text into a callable ``kernel`` in a fresh module namespace."""

from __future__ import annotations

import hashlib
import inspect
import types
from dataclasses import dataclass
from typing import Any, Callable


class CandidateError(Exception):
    """The candidate cannot be loaded; ``status`` is the report status it earns."""

    def __init__(self, status: str, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


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
        raise CandidateError("compile_error", f"syntax error at line {exc.lineno}: {exc.msg}") from exc
    except ValueError as exc:  # e.g. null bytes
        raise CandidateError("compile_error", f"source cannot be compiled: {exc}") from exc


def load_candidate(source: str, filename: str = "<candidate>", module_name: str | None = None) -> LoadedCandidate:
    """Execute the source in a new module (never registered in ``sys.modules``) and fetch ``kernel``."""
    sha = source_sha(source)
    code = compile_source(source, filename)
    module = types.ModuleType(module_name or f"candidate_{sha}")
    module.__file__ = filename
    try:
        exec(code, module.__dict__)
    except Exception as exc:
        raise CandidateError("compile_error", f"module failed to import: {type(exc).__name__}: {exc}") from exc
    kernel = module.__dict__.get("kernel")
    if kernel is None:
        raise CandidateError("compile_error", "the candidate defines no kernel()")
    if not callable(kernel):
        raise CandidateError("compile_error", f"kernel is a {type(kernel).__name__}, not a function")
    return LoadedCandidate(module, kernel, sha)


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
