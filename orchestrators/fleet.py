"""A local fleet on loopback, for trying many daemons and workers on one machine.

One folder holds everything (the PostgreSQL cluster goes to a folder of its own in /tmp when run as root,
since the server then runs as ``postgres``): a PostgreSQL cluster (the system's binaries), a Chroma server, the gRPC host,
a supervisor that keeps N daemons alive with warm standby daemons beside them (each daemon process with its
own data folder under ``daemons/``, all on the one store and Chroma server) and a supervisor that keeps M
tester workers alive with their warm spares; the daemons' jobs are judged by those workers through the host.
``fleet.json`` in that folder lists every process it started, so ``status`` and ``down`` work from any shell;
every server binds 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import structlog
from pydantic import BaseModel

log = structlog.get_logger("orchestrators.fleet")

ROOT = Path(__file__).resolve().parent.parent
STATE = "fleet.json"
LEASE_S = 10.0  # the daemons' job leases; a daemon of this host that dies has its leases ended within a second
DAEMON_STATE = "daemon.json"  # what each daemon writes in its data folder (``orchestrators.daemon.STATE_FILE``)


class FleetError(RuntimeError):
    """The fleet could not be started or found (one line, for the user)."""


class Proc(BaseModel):
    name: str
    pid: int
    log: str
    port: int | None = None
    data_dir: str | None = None
    count: int | None = None  # a supervisor's: the processes it keeps serving
    spares: int | None = None  # and the warm spares it keeps beside them


class FleetState(BaseModel):
    root: str
    store_url: str
    chroma_url: str
    host: str
    procs: list[Proc]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def postgres_bin() -> Path:
    """The folder of the system's ``initdb`` and ``postgres``, newest version first."""
    for folder in sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: p.parent.name, reverse=True):
        if (folder / "initdb").exists() and (folder / "postgres").exists():
            return folder
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).resolve().parent
    raise FleetError("no PostgreSQL binaries found (install Debian's postgresql package)")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a child of this process that exited is a zombie until reaped
        return os.waitpid(pid, os.WNOHANG)[0] != pid
    except ChildProcessError:
        return True


def _spawn(name: str, args: list[str], root: Path, env: dict[str, str] | None = None, user: str | None = None,
           *, own_stderr: bool = False, **extra: Any) -> Proc:
    """Start ``args`` with its output in ``logs/<name>.log``; with ``own_stderr`` (a supervisor, whose stdout
    lines are read back) its stderr, and so its children's logs, goes to ``logs/<name>.stderr.log`` instead,
    so that no log line ever splits one of those lines."""
    log_path = root / "logs" / f"{name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as files:
        out = files.enter_context(log_path.open("ab"))
        err = files.enter_context(log_path.with_suffix(".stderr.log").open("ab")) if own_stderr else subprocess.STDOUT
        proc = subprocess.Popen(args, stdout=out, stderr=err, stdin=subprocess.DEVNULL, cwd=str(ROOT),
                                env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}, start_new_session=True,
                                user=user)
    return Proc(name=name, pid=proc.pid, log=str(log_path), **extra)


def _wait(ready: Any, what: str, proc: Proc, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ready():
            return
        if not alive(proc.pid):
            tail = Path(proc.log).read_text(errors="replace")[-1500:]
            raise FleetError(f"{what} exited while starting; see {proc.log}: {tail.splitlines()[-1:] or ''}")
        time.sleep(0.2)
    raise FleetError(f"{what} did not become ready within {timeout_s:.0f} s; see {proc.log}")


def _pg_ready(port: int) -> bool:
    import psycopg

    try:
        with psycopg.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres", connect_timeout=2):
            return True
    except psycopg.OperationalError:
        return False


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def start_postgres(root: Path) -> tuple[Proc, str]:
    bin_dir = postgres_bin()
    user = "postgres" if os.geteuid() == 0 else None
    if user:  # the server runs as ``postgres`` (initdb refuses root), which may not reach root's folders
        folder = Path(tempfile.mkdtemp(prefix="maxkernel-fleet-pg-"))
        folder.chmod(0o755)
        shutil.chown(folder, user, user)
    else:
        folder = root / "pg"
        folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "data").exists():
        made = subprocess.run([str(bin_dir / "initdb"), "-D", str(folder / "data"), "-U", "postgres", "--auth=trust",
                               "--no-sync"], capture_output=True, text=True, user=user, timeout=120)
        if made.returncode != 0:
            raise FleetError(f"initdb failed in {folder}: {(made.stderr or made.stdout).strip().splitlines()[-1:]}")
    port = free_port()
    (root / "logs").mkdir(parents=True, exist_ok=True)
    if user:
        shutil.chown(root / "logs", user, user)
    proc = _spawn("postgres", [str(bin_dir / "postgres"), "-D", str(folder / "data"), "-p", str(port),
                               "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={folder}",
                               "-c", "fsync=off", "-c", "max_connections=200"], root, user=user, port=port,
                  data_dir=str(folder))
    _wait(lambda: _pg_ready(port), "PostgreSQL", proc)
    return proc, f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"


# The Chroma server is the Rust server behind ``chroma run``; that command first imports the whole Python client
# (``chromadb``), which a server does not use. Started here through its bindings alone, a restart costs the
# server's own start and not a second of imports.
CHROMA_SERVER = "import sys, chromadb_rust_bindings; chromadb_rust_bindings.cli(['chroma', *sys.argv[1:]])"


def start_chroma(root: Path, port: int | None = None) -> Proc:
    port = port or free_port()
    proc = _spawn("chroma", [sys.executable, "-c", CHROMA_SERVER, "run", "--host", "127.0.0.1", "--port", str(port),
                             "--path", str(root / "chroma")], root, port=port)
    _wait(lambda: _http_ok(f"http://127.0.0.1:{port}/api/v2/heartbeat"), "the Chroma server", proc)
    return proc


def start_host(root: Path) -> Proc:
    port = free_port()
    proc = _spawn("host", [sys.executable, "-m", "actors.host", f"127.0.0.1:{port}"], root, port=port)
    _wait(lambda: _port_open(port), "the gRPC host", proc)
    return proc


def start_daemons(state: FleetState, count: int, spares: int = 1, *, concurrency: int = 1, lease_s: float = LEASE_S,
                  testers: bool = True) -> Proc:
    """The supervisor of ``count`` daemons on the fleet's store and Chroma, with ``spares`` warm standby daemons
    to replace a dead one (each daemon process in a data folder of its own under ``<root>/daemons``); with
    ``testers`` their jobs are judged by the fleet's tester workers through the host, else each in its own
    evaluator."""
    root = Path(state.root)
    return _spawn("daemons", [sys.executable, "-m", "orchestrators.daemon", "--supervise", "--count", str(count),
                              "--spares", str(spares), "--concurrency", str(concurrency), "--lease", str(lease_s),
                              *(["--testers", state.host] if testers else [])], root,
                  env={"MAXKERNEL_DATA_DIR": str(root), "MAXKERNEL_STORE_URL": state.store_url,
                       "MAXKERNEL_CHROMA_URL": state.chroma_url}, data_dir=str(root / "daemons"),
                  own_stderr=True, count=count, spares=spares)


def start_testers(state: FleetState, count: int, spares: int = 1) -> Proc:
    """The supervisor of ``count`` tester workers, with ``spares`` warm standby workers to replace a dead one."""
    root = Path(state.root)
    return _spawn("testers", [sys.executable, "-m", "actors.worker", "--supervise", "--count", str(count),
                              "--spares", str(spares), "--host", state.host, "--roles", "tester"], root,
                  env={"MAXKERNEL_STORE_URL": state.store_url, "MAXKERNEL_CHROMA_URL": state.chroma_url},
                  own_stderr=True, count=count, spares=spares)


def up(root: Path, *, daemons: int = 2, testers: int = 2, concurrency: int = 1, spares: int = 1,
       daemon_spares: int = 1) -> FleetState:
    """Start a fleet in ``root`` (refused when one runs there already); ``spares`` warm tester workers and
    ``daemon_spares`` warm standby daemons wait beside the serving ones."""
    if read(root) is not None:
        raise FleetError(f"a fleet is already running in {root} (maxkernel fleet down first)")
    root.mkdir(parents=True, exist_ok=True)
    started: list[Proc] = []
    try:
        pg, store_url = start_postgres(root)
        started.append(pg)
        chroma = start_chroma(root)
        started.append(chroma)
        host = start_host(root)
        started.append(host)
        state = FleetState(root=str(root), store_url=store_url, chroma_url=f"http://127.0.0.1:{chroma.port}",
                           host=f"127.0.0.1:{host.port}", procs=started)
        from memory import Store

        Store.open(store_url).close()  # migrate once, before the daemons race to
        if daemons:
            started.append(start_daemons(state, daemons, daemon_spares, concurrency=concurrency, testers=testers > 0))
        if testers:
            started.append(start_testers(state, testers, spares))
        state.procs = started
        write(state)
        return state
    except BaseException:
        stop_procs(started)
        raise


def write(state: FleetState) -> None:
    (Path(state.root) / STATE).write_text(state.model_dump_json(indent=2))


def read(root: Path) -> FleetState | None:
    """The fleet running in ``root``, or None (a state file whose processes are all gone counts as none)."""
    try:
        state = FleetState.model_validate_json((root / STATE).read_text())
    except (OSError, ValueError):
        return None
    return state if any(alive(p.pid) for p in state.procs) else None


def stop_procs(procs: list[Proc], wait_s: float = 20.0) -> None:
    """SIGTERM each process group, newest first, then SIGKILL what is left after ``wait_s``."""
    for proc in reversed(procs):
        if alive(proc.pid):
            try:
                os.killpg(proc.pid, signal.SIGINT if proc.name == "postgres" else signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass
            deadline = time.monotonic() + wait_s
            while alive(proc.pid) and time.monotonic() < deadline:
                time.sleep(0.1)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def down(root: Path) -> list[Proc]:
    state = read(root)
    if state is None:
        raise FleetError(f"no fleet is running in {root}")
    stop_procs(state.procs)
    for proc in state.procs:  # a cluster kept outside the fleet's folder goes with it
        if proc.name == "postgres" and proc.data_dir and Path(proc.data_dir).name.startswith("maxkernel-fleet-pg-"):
            shutil.rmtree(proc.data_dir, ignore_errors=True)
    (root / STATE).unlink(missing_ok=True)
    return state.procs


def status(root: Path) -> list[dict[str, Any]]:
    """Every process of the fleet: alive or not; under the daemons' supervisor, each live daemon (serving a
    slot, or a warm standby) and the jobs it is running."""
    state = read(root)
    if state is None:
        raise FleetError(f"no fleet is running in {root}")
    rows: list[dict[str, Any]] = []
    for proc in state.procs:
        row: dict[str, Any] = {"name": proc.name, "pid": proc.pid, "alive": alive(proc.pid), "port": proc.port,
                               "doing": ""}
        if proc.name == "chroma":
            row["doing"] = state.chroma_url
        elif proc.name == "postgres":
            row["doing"] = state.store_url
        elif proc.name == "host":
            row["doing"] = state.host
        elif proc.name in ("testers", "daemons") and row["alive"]:
            row["doing"] = _supervised_doing(proc)
        rows.append(row)
        if proc.name == "daemons" and row["alive"]:
            rows.extend(_daemon_rows(proc))
    return rows


def _supervised_doing(supervisor: Proc) -> str:
    """How many processes serve, how many spares wait on standby and how many took a dead one's place."""
    lines = Path(supervisor.log).read_text(errors="replace").splitlines()
    serving = sum(1 for pid in serving_workers(supervisor).values() if alive(pid))
    promoted = {line.split()[2] for line in lines if line.startswith("promoted ")}
    warm = {line.split()[1] for line in lines if line.startswith("standby ")} - promoted
    spares = sum(1 for pid in warm if pid.isdigit() and alive(int(pid)))
    return f"{serving} serving, {spares} on standby, {len(promoted)} spares promoted"


def live_daemons(supervisor: Proc) -> dict[int, tuple[Path, int | None]]:
    """Pid -> (data folder, API port) of each live daemon under the daemons' supervisor, serving or on standby
    (from the state file each writes once it is warm)."""
    found: dict[int, tuple[Path, int | None]] = {}
    for path in Path(supervisor.data_dir or "").glob(f"*/{DAEMON_STATE}"):
        try:
            state = json.loads(path.read_text())
            pid = int(state["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if alive(pid):
            found[pid] = (path.parent, state.get("port"))
    return found


def _daemon_rows(supervisor: Proc) -> list[dict[str, Any]]:
    slot_of = {pid: slot for slot, pid in serving_workers(supervisor).items()}
    rows = []
    for pid, (data_dir, port) in sorted(live_daemons(supervisor).items(), key=lambda kv: (kv[0] not in slot_of, kv[0])):
        name = f"daemon-{slot_of[pid]}" if pid in slot_of else "daemon-standby"
        rows.append({"name": name, "pid": pid, "alive": True, "port": port, "doing": _daemon_doing(data_dir)})
    return rows


def _daemon_doing(data_dir: Path) -> str:
    from maxkernel.config import load_settings
    from orchestrators.httpapi import auth_headers

    try:
        port = json.loads((data_dir / DAEMON_STATE).read_text())["port"]
        probe = urllib.request.Request(f"http://127.0.0.1:{port}/status", headers=auth_headers(load_settings().token))
        with urllib.request.urlopen(probe, timeout=3) as response:
            info = json.loads(response.read())
    except (OSError, ValueError, KeyError):
        return "starting"
    if info.get("standby"):
        return "standby (warm, claims nothing until promoted)"
    running = info.get("running") or []
    sent = f", {info.get('sent_to_testers', 0)} sent to testers"
    return (f"running {', '.join(j[:8] for j in running)}" if running else f"idle ({info.get('finished', 0)} finished)") + sent


class MemoryAudit(BaseModel):
    """SQL's kernels and notes against the Chroma server's vectors: each record has its vector and each
    vector its record."""

    kernels: int
    notes: int
    missing_vectors: list[str]  # records in SQL whose vector Chroma lacks
    orphan_vectors: list[str]  # vectors in Chroma whose record SQL lacks

    @property
    def consistent(self) -> bool:
        return not self.missing_vectors and not self.orphan_vectors


def memory_audit(store_url: str, chroma_url: str) -> MemoryAudit:
    """Compare the ids of the memory's records in the store with those of the vectors on the Chroma server."""
    from urllib.parse import urlparse

    import chromadb
    import sqlalchemy as sa

    from memory import Store
    from memory.schema import KernelRow, NoteRow
    from memory.vectors import KERNELS, NOTES

    with Store.open(store_url) as store, store.engine.connect() as conn:
        sql = {KERNELS: set(conn.execute(sa.select(KernelRow.id)).scalars()),
               NOTES: set(conn.execute(sa.select(NoteRow.id)).scalars())}
    parsed = urlparse(chroma_url)
    client = chromadb.HttpClient(host=parsed.hostname or "127.0.0.1", port=parsed.port or 8000,
                                 settings=chromadb.Settings(anonymized_telemetry=False))
    names = {c.name if hasattr(c, "name") else str(c) for c in client.list_collections()}
    vectors = {name: set(client.get_collection(name).get(include=[])["ids"]) if name in names else set()
               for name in sql}
    return MemoryAudit(kernels=len(sql[KERNELS]), notes=len(sql[NOTES]),
                       missing_vectors=sorted(i for n in sql for i in sql[n] - vectors[n]),
                       orphan_vectors=sorted(i for n in sql for i in vectors[n] - sql[n]))


def serving_workers(supervisor: Proc) -> dict[int, int]:
    """Slot -> pid of the worker (or daemon) serving it now, from its supervisor's log (spares on standby
    left out)."""
    slots: dict[int, int] = {}
    for line in Path(supervisor.log).read_text(errors="replace").splitlines():
        word = line.split()
        if len(word) == 3 and word[0] in ("started", "promoted") and word[1].isdigit() and word[2].isdigit():
            slots[int(word[1])] = int(word[2])
    return slots


def _supervised_ready(supervisor: Proc, count: int, spares: int) -> bool:
    """Whether ``count`` slots of ``supervisor`` have said they serve and ``spares`` spares are on standby."""
    seen = Path(supervisor.log).read_text(errors="replace").splitlines()
    standby = sum(1 for line in seen if line.startswith("standby "))
    return len({line.split()[1] for line in seen if line.startswith("ready ")}) >= count and standby >= spares


def wait_ready(state: FleetState, *, testers: int, spares: int = 0, timeout_s: float = 180.0) -> None:
    """Wait until every daemon serves and its standby daemons are warm, ``testers`` tester workers have said
    they are ready and ``spares`` spares are on standby."""
    deadline = time.monotonic() + timeout_s
    daemons = next((p for p in state.procs if p.name == "daemons"), None)
    supervisor = next((p for p in state.procs if p.name == "testers"), None)

    def ready() -> bool:
        if daemons is not None and not _supervised_ready(daemons, daemons.count or 0, daemons.spares or 0):
            return False
        return supervisor is None or not testers or _supervised_ready(supervisor, testers, spares)

    while not ready():
        dead = [p.name for p in state.procs if not alive(p.pid)]
        if dead:
            raise FleetError(f"{', '.join(dead)} exited while the fleet was starting; see {state.root}/logs")
        if time.monotonic() > deadline:
            raise FleetError(f"the fleet in {state.root} was not ready within {timeout_s:.0f} s; see its logs")
        time.sleep(0.2)
