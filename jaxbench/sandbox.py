"""Confinement of candidate workers, with what Linux and Python give an unprivileged process.

Layers, outermost first: a process group of its own (the pool kills the group), rlimits (address space,
CPU time per candidate, file size, core dumps, process count), a private network namespace where the
kernel allows one, and an audit hook that, while candidate code runs, refuses network, process
creation, signals, native-code loading, writes outside the candidate's temp dir and reads of task
references. Python audit hooks cannot be removed once installed.
"""

from __future__ import annotations

import ctypes
import os
import resource
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

BLOCKED_EVENTS = {
    "socket.connect": "network access",
    "socket.bind": "network access",
    "socket.sendto": "network access",
    "socket.sendmsg": "network access",
    "socket.getaddrinfo": "network access",
    "socket.gethostbyname": "network access",
    "subprocess.Popen": "process creation",
    "os.system": "process creation",
    "os.exec": "process creation",
    "os.posix_spawn": "process creation",
    "os.spawn": "process creation",
    "os.fork": "process creation",
    "os.forkpty": "process creation",
    "os.kill": "signalling another process",
    "os.killpg": "signalling another process",
    "os.startfile": "process creation",
    "ctypes.dlopen": "loading native code",
    "ctypes.dlsym": "loading native code",
    "ctypes.cdata": "raw memory access",
    "ctypes.addressof": "raw memory access",
    "ctypes.string_at": "raw memory access",
    "ctypes.call_function": "native calls",
    "object.__setattr__": None,  # decided by _check_setattr
    "builtins.input": "reading standard input",
}

_PATH_EVENTS = {"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.symlink",
                "os.link", "os.truncate", "os.utime", "shutil.rmtree", "shutil.move", "shutil.copyfile"}

_PROTECTED_MODULE_PREFIXES = ("jax", "jaxlib", "numpy", "time", "jaxbench", "builtins", "math")


class SandboxViolation(Exception):
    """Candidate code tried something the sandbox refuses."""


@dataclass
class Policy:
    """What the audit hook allows while armed."""

    armed: bool = False
    write_root: Path | None = None
    protected: list[Path] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)


POLICY = Policy()


def _resolve(path: Any) -> Path | None:
    if isinstance(path, int):
        return None
    try:
        return Path(os.fsdecode(path)).resolve()
    except (TypeError, ValueError, OSError):
        return None


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _refuse(what: str) -> None:
    POLICY.violations.append(what)
    raise SandboxViolation(f"sandbox: {what} is not allowed")


def _check_open(path: Any, mode: Any, flags: Any) -> None:
    resolved = _resolve(path)
    if resolved is None:
        return
    if resolved.name == "reference.py" or any(_inside(resolved, p) for p in POLICY.protected):
        _refuse(f"reading {resolved}")
    writing = False
    if isinstance(mode, str) and any(c in mode for c in "wax+"):
        writing = True
    if isinstance(flags, int) and flags & _WRITE_FLAGS:
        writing = True
    if writing and not (POLICY.write_root and _inside(resolved, POLICY.write_root)) and str(resolved) != "/dev/null":
        _refuse(f"writing {resolved}")


def _check_setattr(args: tuple[Any, ...]) -> None:
    obj, name = args[0], args[1]
    module_name = getattr(obj, "__name__", "") if isinstance(obj, type(sys)) else ""
    if module_name and module_name.split(".")[0] in _PROTECTED_MODULE_PREFIXES:
        _refuse(f"patching {module_name}.{name}")


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if not POLICY.armed:
        return
    if event == "open":
        _check_open(args[0], args[1] if len(args) > 1 else None, args[2] if len(args) > 2 else None)
        return
    if event in _PATH_EVENTS:
        for a in args:
            resolved = _resolve(a) if isinstance(a, (str, bytes, os.PathLike)) else None
            if resolved is not None and not (POLICY.write_root and _inside(resolved, POLICY.write_root)):
                _refuse(f"{event} on {resolved}")
        return
    if event == "object.__setattr__":
        _check_setattr(args)
        return
    reason = BLOCKED_EVENTS.get(event)
    if reason:
        _refuse(f"{reason} ({event})")


def _unshare_network() -> str:
    """A private network namespace: no interfaces but a down loopback, so every connect fails."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return "unavailable"
    for flags, name in ((CLONE_NEWNET, "netns"), (CLONE_NEWUSER | CLONE_NEWNET, "userns+netns")):
        if libc.unshare(flags) == 0:
            return name
    return "unavailable"


def set_cpu_budget(seconds: float) -> None:
    """Let the worker use ``seconds`` more CPU time; past that the kernel sends SIGXCPU."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    used = usage.ru_utime + usage.ru_stime
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = int(used + seconds) + 1
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def enter(memory_bytes: int, max_file_bytes: int = 512 << 20) -> dict[str, str]:
    """Apply process-wide limits once, after JAX is imported and warm. Returns what is in force."""
    layers: dict[str, str] = {}
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (max_file_bytes, max_file_bytes))
    layers["fsize"] = str(max_file_bytes)
    if memory_bytes > 0:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        layers["address_space"] = str(memory_bytes)
    try:
        resource.setrlimit(resource.RLIMIT_NPROC, (256, 256))
        layers["nproc"] = "256 (not enforced for root)" if os.geteuid() == 0 else "256"
    except (ValueError, OSError):
        layers["nproc"] = "unavailable"
    layers["network_namespace"] = _unshare_network()
    sys.addaudithook(_hook)
    layers["audit_hook"] = "installed"
    return layers


def arm(write_root: Path, protected: list[Path]) -> None:
    POLICY.write_root = write_root.resolve()
    POLICY.protected = [p.resolve() for p in protected]
    POLICY.violations = []
    POLICY.armed = True


def disarm() -> list[str]:
    POLICY.armed = False
    return list(POLICY.violations)
