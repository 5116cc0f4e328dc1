"""The one error style of every command: one line on stderr naming what and where, exit code 2.

``guarded`` turns the errors a user can cause inside a command into that line; ``OneLineTyper`` does the
same for what Typer and Click find before a command runs (an unknown option, a bad flag value, a missing
argument), which they would otherwise print as a boxed, many-line panel.
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

USER_ERROR_EXIT = 2


class UserError(Exception):
    """An error the user can fix: printed as one line, exit code 2."""


def one_line(text: object) -> str:
    """Collapse a message that spans several lines (drivers, YAML, pydantic) into one."""
    from memory.errors import one_line as collapse

    return collapse(text)


def fail(message: object, code: int = USER_ERROR_EXIT) -> NoReturn:
    Console(stderr=True).print(f"[bold red]error:[/] {escape(one_line(message))}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def user_errors() -> tuple[type[BaseException], ...]:
    """Every exception type that means "the user asked for something that cannot be", imported on use."""
    from pydantic import ValidationError

    from jaxbench.task import TaskError
    from maxkernel.analysis.signature import SignatureError
    from maxkernel.config import ConfigError
    from maxkernel.llm.errors import LlmError
    from maxkernel.auth import HostUnreachable
    from maxkernel.targets.names import TargetError
    from memory.errors import MemoryStoreError

    return (TaskError, ConfigError, UserError, TargetError, LlmError, MemoryStoreError, SignatureError,
            ValidationError, HostUnreachable)


def guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn known user-caused exceptions into one clear line and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except user_errors() as exc:
            fail(exc)
        except FileNotFoundError as exc:
            fail(f"{exc.filename}: no such file")
        except IsADirectoryError as exc:
            fail(f"{exc.filename}: is a directory")
        except PermissionError as exc:
            fail(f"{exc.filename}: permission denied")
        except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: the run recorded itself as interrupted first
            name = str(exc) or "SIGINT"
            Console(stderr=True).print(f"interrupted ({name}): what ran is stored, marked interrupted",
                                       highlight=False, soft_wrap=True)
            raise typer.Exit(getattr(exc, "exit_code", 130)) from None

    return wrapper


class OneLineTyper(typer.Typer):
    """A Typer app whose usage errors (bad flags, values, arguments) are one line and exit code 2."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["standalone_mode"] = False
        try:
            code = super().__call__(*args, **kwargs)
        except typer.TyperException as exc:  # Click's usage and parameter errors (Typer vendors Click)
            ctx = getattr(exc, "ctx", None)
            where = f"{ctx.command_path}: " if ctx is not None else ""
            message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
            Console(stderr=True).print(f"[bold red]error:[/] {escape(where + one_line(message))}", highlight=False,
                                       soft_wrap=True)
            sys.exit(USER_ERROR_EXIT)
        except typer.Abort:
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)
