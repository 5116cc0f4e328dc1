"""Fixtures of the memory tests: real SQLite files, a real throwaway PostgreSQL, embedded Chroma and
a real Chroma server, all on loopback and in temporary directories.

PostgreSQL: ``MAXKERNEL_TEST_PG_URL`` (from ``.ci/postgres.sh``) if set, else a server this session
starts from the installed binaries (``/usr/lib/postgresql/*/bin``); tests that need it are skipped,
with the reason, only when neither exists.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

from jaxbench.report import EvalReport
from maxkernel.config import Settings


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Never touch the user's data dir or config, whatever the environment says."""
    for name in ("MAXKERNEL_STORE_URL", "MAXKERNEL_CHROMA_URL", "MAXKERNEL_CONFIG", "MAXKERNEL_EMBEDDING"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MAXKERNEL_DATA_DIR", str(tmp_path / "data"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def unused_port() -> int:
    """A loopback port nothing listens on."""
    return free_port()


# -- PostgreSQL ---------------------------------------------------------------------------------


def postgres_bin() -> Path | None:
    """The directory of initdb/pg_ctl/postgres, newest version first."""
    for folder in sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: p.parent.name, reverse=True):
        if (folder / "initdb").exists() and (folder / "postgres").exists():
            return folder
    initdb = shutil.which("initdb")
    return Path(initdb).resolve().parent if initdb else None


class PostgresServer:
    """A throwaway cluster in /tmp, owned by ``postgres`` when we are root (initdb refuses root)."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin = bin_dir
        self.dir = Path(tempfile.mkdtemp(prefix="maxkernel-pg-"))
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.user = "postgres" if os.geteuid() == 0 else None

    def _run(self, *args: str) -> None:
        subprocess.run(args, check=True, capture_output=True, user=self.user, timeout=120)

    def start(self) -> str:
        self.dir.chmod(0o755)
        if self.user:
            shutil.chown(self.dir, self.user, self.user)
        self._run(str(self.bin / "initdb"), "-D", str(self.dir / "data"), "-U", "postgres", "--auth=trust", "--no-sync")
        log = (self.dir / "server.log").open("wb")
        self.proc = subprocess.Popen(
            [
                str(self.bin / "postgres"),
                "-D", str(self.dir / "data"),
                "-p", str(self.port),
                "-c", "listen_addresses=127.0.0.1",
                "-c", f"unix_socket_directories={self.dir}",
                "-c", "fsync=off",
                "-c", "synchronous_commit=off",
                "-c", "full_page_writes=off",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            user=self.user,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while True:
            try:
                with psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname="postgres"):
                    break
            except psycopg.OperationalError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"PostgreSQL did not start: {(self.dir / 'server.log').read_text()[-2000:]}")
                time.sleep(0.2)
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # fast shutdown
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_admin_url() -> Iterator[str]:
    """A URL of a PostgreSQL server whose user may create databases."""
    given = os.environ.get("MAXKERNEL_TEST_PG_URL")
    if given:
        yield given
        return
    bin_dir = postgres_bin()
    if bin_dir is None:
        pytest.skip("no PostgreSQL binaries installed (run `bash .ci/postgres.sh --install-only`)")
    server = PostgresServer(bin_dir)
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture
def pg_url(pg_admin_url: str) -> Iterator[str]:
    """A fresh, empty database for one test."""
    admin = make_url(pg_admin_url)
    name = f"mk_{uuid.uuid4().hex[:12]}"
    conninfo = admin.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield admin.set(database=name).render_as_string(hide_password=False)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The same store tests, on a SQLite file and on PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store' / 'maxkernel.db'}"
    return request.getfixturevalue("pg_url")


# -- Chroma server ------------------------------------------------------------------------------


def chroma_executable() -> str:
    beside = Path(sys.executable).parent / "chroma"
    return str(beside) if beside.exists() else (shutil.which("chroma") or "chroma")


@pytest.fixture(scope="session")
def chroma_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``chroma run`` on loopback and a free port, for the whole session."""
    port = free_port()
    path = tmp_path_factory.mktemp("chroma-server")
    log_path = path.parent / "chroma-server.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [chroma_executable(), "run", "--host", "127.0.0.1", "--port", str(port), "--path", str(path / "db")],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{url}/api/v2/heartbeat", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"chroma server did not start: {log_path.read_text()[-2000:]}")
            time.sleep(0.25)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _empty_server(url: str) -> None:
    """Tests share one server: each starts with no collections."""
    import chromadb

    host, port = url.removeprefix("http://").split(":")
    client = chromadb.HttpClient(host=host, port=int(port), settings=chromadb.Settings(anonymized_telemetry=False))
    for collection in client.list_collections():
        client.delete_collection(collection.name)


@pytest.fixture(params=["sqlite+embedded", "postgresql+server"])
def settings(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    """The facade's tests, on one machine (SQLite file + embedded Chroma) and on shared servers
    (PostgreSQL + a Chroma server)."""
    if request.param == "sqlite+embedded":
        return Settings(data_dir=str(tmp_path / "data"))
    url = request.getfixturevalue("chroma_server")
    _empty_server(url)
    return Settings(data_dir=str(tmp_path / "data"), store_url=request.getfixturevalue("pg_url"), chroma_url=url)


@pytest.fixture
def local_settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=str(tmp_path / "data"))


# -- tasks and reports --------------------------------------------------------------------------

TASKS: dict[str, tuple[str, bool, str]] = {
    # id: (category, takes the bias b, body of reference); x [batch, n_in], w [n_in, n_out], b [n_out]
    "t_gemm_gelu": ("matmul", True, "return jax.nn.gelu(x @ w + b, approximate=False)"),
    "t_gemm_relu": ("matmul", True, "return jnp.maximum(x @ w + b, 0.0)"),
    "t_gemm_tanh_scale": ("matmul", True, "return jnp.tanh(x @ w + b) * 0.5"),
    "t_rmsnorm": ("normalization", False, "return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * w[:, 0]"),
    "t_softmax": ("reduction", False, "return jax.nn.softmax(x + w[:, 0], axis=-1)"),
    "t_cumsum": ("reduction", False, "return jnp.cumsum(x, axis=0) * w[:, 0]"),
}

_REFERENCE = '''
import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, n_in, n_out):
    kx, kw, kb = jax.random.split(key, 3)
    x = jax.random.normal(kx, (batch, n_in), jnp.float32)
    w = jax.random.normal(kw, (n_in, n_out), jnp.float32) / n_in ** 0.5
    b = jax.random.normal(kb, (n_out,), jnp.float32)
    return {args}, {{}}


def reference({params}):
    {body}
'''


@pytest.fixture(scope="session")
def task_dir(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """Task folders written for these tests (the suite's tasks are still being written)."""
    root = tmp_path_factory.mktemp("tasks")

    def make(task_id: str) -> Path:
        folder = root / task_id
        if not folder.exists():
            category, uses_b, body = TASKS[task_id]
            folder.mkdir()
            (folder / "reference.py").write_text(
                _REFERENCE.format(
                    args="(x, w, b)" if uses_b else "(x, w)",
                    params="x, w, b" if uses_b else "x, w",
                    body=body,
                )
            )
            (folder / "task.yaml").write_text(
                textwrap.dedent(
                    f"""\
                    id: {task_id}
                    name: {task_id}
                    category: {category}
                    description: test task
                    dtype: float32
                    tolerance: {{atol: 1.0e-4, rtol: 1.0e-4}}
                    sizes:
                      cpu: {{batch: 64, n_in: 128, n_out: 128}}
                      full: {{batch: 1024, n_in: 4096, n_out: 4096}}
                    """
                )
            )
        return folder

    return make


def passing_report(task: str, *, target: str = "cpu", speedup: float = 1.7) -> EvalReport:
    return EvalReport(
        task=task,
        target=target,
        status="ok",
        correct=True,
        max_abs_err=1e-6,
        ref_ms=3.4,
        kernel_ms=3.4 / speedup,
        speedup=speedup,
        cv=0.02,
        basis="measured",
        label="pallas-kernel",
    )


def kernel_code(name: str) -> str:
    return textwrap.dedent(
        f"""\
        import jax
        from jax.experimental import pallas as pl


        def _body(x_ref, w_ref, o_ref):
            o_ref[...] = x_ref[...] @ w_ref[...]  # {name}


        def kernel(x, w, *rest):
            return pl.pallas_call(_body, out_shape=jax.ShapeDtypeStruct((x.shape[0], w.shape[1]), x.dtype))(x, w)
        """
    )


@pytest.fixture
def make_report() -> Callable[..., EvalReport]:
    """``make_report(task, target=..., speedup=...)``: a report that passed."""
    return passing_report


@pytest.fixture
def make_code() -> Callable[[str], str]:
    """``make_code(name)``: a small Pallas kernel source, distinct per name."""
    return kernel_code
