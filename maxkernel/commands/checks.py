"""What every command checks before any work starts: output paths, run limits, the target at hand.

A bad ``--json`` path found after a twenty-minute run wastes the run; a ``--target gpu`` on a machine
with no GPU would measure on the CPU and label it a GPU result. Both are refused up front, in one line.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from maxkernel.clierrors import UserError

if TYPE_CHECKING:
    from jaxbench.task import Task


def check_writable(path: Path, flag: str) -> None:
    """A file the command will write at the end: its folder must exist and be writable, and it no folder."""
    if path.is_dir():
        raise UserError(f"{flag} {path}: is a folder, not a file")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise UserError(f"{flag} {path}: folder {parent} does not exist")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise UserError(f"{flag} {path}: not writable")


def check_folder(path: Path, flag: str) -> None:
    """A folder the command will create or write into."""
    if path.exists() and not path.is_dir():
        raise UserError(f"{flag} {path}: exists and is not a folder")
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not os.access(existing, os.W_OK):
        raise UserError(f"{flag} {path}: {existing} is not writable")


def check_limits(budget: Optional[float], evals: Optional[int], evals_flag: str = "--evals") -> None:
    """``--budget SECONDS`` and ``--evals N``, the limits of every command that runs optimizations."""
    if budget is not None and budget <= 0:
        raise UserError(f"--budget {budget:g}: must be a positive number of seconds")
    if evals is not None:
        check_at_least(evals, evals_flag, 1)


def check_at_least(value: int, flag: str, minimum: int) -> None:
    """A count option (a width, a depth, a number of lanes) that below ``minimum`` means nothing."""
    if value < minimum:
        raise UserError(f"{flag} {value}: must be at least {minimum}")


def check_target(name: str) -> str:
    """A known target that this machine can run or model: the bare ``gpu`` needs a GPU JAX can see, a
    ``gpu-<chip>`` the optional CUDA plugin that lowers for it."""
    from maxkernel.targets.names import parse_target

    kind, chip = parse_target(name)
    if kind == "gpu" and chip is not None:
        from maxkernel.targets.gpu_lowering import require_plugin

        require_plugin(name)
    if name.strip().lower() == "gpu":
        import jax

        try:
            gpus = jax.devices("gpu")
        except RuntimeError:
            gpus = []
        if not gpus:
            seen = ", ".join(sorted({f"{d.platform} ({d.device_kind})" for d in jax.devices()}))
            raise UserError(f"--target gpu: no GPU on this machine (JAX sees {seen}); use --target cpu here")
    return name


def check_reference(task: "Task") -> None:
    """The task's reference imports, draws its inputs and traces: a broken one is one line here, not a failed
    session in the store (and a note in the memory that later plans would read as a prior)."""
    from maxkernel.analysis.signature import check_reference as check

    check(task)


def check_store() -> None:
    """Open and close the store, so that a corrupt or unreachable one is named before a run starts."""
    from maxkernel.config import load_settings
    from memory import Store

    Store.open(load_settings().resolved_store_url).close()


def check_run(task: str, brain: str, budget: Optional[float], evals: Optional[int], target: str, out: Path,
              json_out: Optional[Path]) -> "Task":
    """Everything an optimizing command checks before work starts (brain, limits, target, task, output paths,
    store), in one order for every such command; returns the loaded task."""
    from actors.session import BRAINS
    from jaxbench.task import load_task

    if brain not in BRAINS:
        raise UserError(f"--brain {brain}: choose one of {', '.join(BRAINS)}")
    check_limits(budget, evals)
    check_target(target)
    loaded = load_task(task)
    check_reference(loaded)
    check_folder(out, "--out")
    if json_out is not None:
        check_writable(json_out, "--json")
    check_store()
    return loaded


def check_address(address: str, flag: str) -> tuple[str, int]:
    """``HOST:PORT`` with a port in range; a flag given where the address belongs is no address."""
    host, sep, port = address.rpartition(":")
    if address.startswith("-") or not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(f"{flag} {address!r}: expected HOST:PORT, e.g. 127.0.0.1:50051")
    return host, int(port)


def check_port_free(host: str, port: int) -> None:
    """Refuse to start a second server on a port another process already listens on."""
    import socket

    with socket.socket(socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host.strip("[]"), port))
        except OSError as exc:
            raise UserError(f"{host}:{port}: cannot listen there ({exc.strerror})") from exc


def resolve_resume(resume: str, kind: str) -> str:
    """The full id of the ``kind`` ("search" or "session") that ``--resume`` names by the one id rule."""
    from maxkernel.config import load_settings
    from memory import Store
    from memory.errors import RecordNotFoundError
    from orchestrators.tables import resolve_id

    with Store.open(load_settings().resolved_store_url) as store:
        try:
            return resolve_id(store, resume, (kind,))[1]
        except RecordNotFoundError as exc:
            raise UserError(f"--resume {resume}: {exc}") from exc
