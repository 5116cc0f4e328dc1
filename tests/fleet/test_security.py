"""Servers bound beyond loopback need a token: the gRPC host and the daemon's HTTP API refuse to start
without one, and with one refuse every worker or request that does not present it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest
from autogen_core import TypeSubscription

from actors.host import BalancingHost, BindRefused
from maxkernel.auth import HostUnreachable, is_loopback
from maxkernel.runtime import connect_worker

from conftest import free_port

ROOT = Path(__file__).resolve().parents[2]


def test_loopback_addresses() -> None:
    assert all(is_loopback(a) for a in ("127.0.0.1:1", "localhost:2", "[::1]:3", "127.0.0.9:4"))
    assert not any(is_loopback(a) for a in ("0.0.0.0:1", "[::]:2", "10.0.0.5:3", "example.org:4"))


def test_a_host_beyond_loopback_without_a_token_does_not_start() -> None:
    with pytest.raises(BindRefused, match="set a token"):
        BalancingHost(f"0.0.0.0:{free_port()}")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MAXKERNEL_TOKEN": ""}
    run = subprocess.run([sys.executable, "-m", "actors.host", f"0.0.0.0:{free_port()}"], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and run.stderr.strip().splitlines()[-1].startswith("error: the gRPC host on 0.0.0.0")


def test_a_host_with_a_token_refuses_workers_without_it() -> None:
    async def scenario() -> None:
        port = free_port()
        host = BalancingHost(f"0.0.0.0:{port}", token="s3cret")
        await host.start()
        try:
            for wrong in ("", "guess"):
                worker = None
                try:
                    # the refusal reaches the worker at connect (said as the user's to fix, HostUnreachable) or at
                    # its first call (the RPC's own error), whichever comes first on a loaded machine
                    with pytest.raises((grpc.aio.AioRpcError, HostUnreachable)) as refused:
                        worker = await asyncio.wait_for(connect_worker(f"127.0.0.1:{port}", token=wrong), 30)
                        await asyncio.wait_for(worker.add_subscription(TypeSubscription("tester", "probe")), 30)
                    if isinstance(refused.value, HostUnreachable):
                        assert "refused the token" in str(refused.value)
                    else:
                        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
                finally:
                    if worker is not None:
                        with contextlib.suppress(Exception):
                            await worker.stop()
            worker = await asyncio.wait_for(connect_worker(f"127.0.0.1:{port}", token="s3cret"), 30)
            await asyncio.wait_for(worker.add_subscription(TypeSubscription("tester", "probe")), 30)
            await worker.stop()
        finally:
            await host.stop()

    asyncio.run(scenario())


def _call(port: int, method: str, path: str, token: str | None = None, body: Any = None) -> tuple[int, Any]:
    import json
    import urllib.error
    import urllib.request

    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token is not None else {})}
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def test_the_http_api_beyond_loopback_needs_a_token_and_refuses_requests_without_it(tmp_path: Path) -> None:
    from memory import Store
    from orchestrators.httpapi import ApiServer
    from orchestrators.httpapi import BindRefused as HttpBindRefused
    from orchestrators.jobs import JobQueue

    with Store.open(f"sqlite:///{tmp_path / 'api.db'}") as store:
        queue = JobQueue(store.engine)
        with pytest.raises(HttpBindRefused, match="set a token"):
            ApiServer(queue, lambda: {"ok": True}, free_port(), host="0.0.0.0")
        api = ApiServer(queue, lambda: {"ok": True}, free_port(), host="0.0.0.0", token="s3cret")
        api.start()
        try:
            for wrong in (None, "", "guess"):
                for method, path, body in (("GET", "/status", None), ("GET", "/jobs", None), ("GET", "/", None),
                                           ("POST", "/jobs", {"task": "12p_RMSNorm"})):
                    code, reply = _call(api.port, method, path, wrong, body)
                    assert code == 401 and "token" in reply["error"], (method, path, wrong)
            assert queue.list() == []  # nothing was submitted by the refused requests
            assert _call(api.port, "GET", "/status", "s3cret") == (200, {"ok": True})
            code, job = _call(api.port, "POST", "/jobs", "s3cret", {"task": "12p_RMSNorm"})
            assert code == 201 and [j.id for j in queue.list()] == [job["id"]]
            assert _call(api.port, "GET", f"/jobs/{job['id']}", "s3cret")[1]["status"] == "queued"
        finally:
            api.stop()


@pytest.mark.slow
def test_a_daemon_bound_beyond_loopback_without_a_token_does_not_start(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MAXKERNEL_TOKEN": "", "MAXKERNEL_DATA_DIR": str(tmp_path)}
    run = subprocess.run([sys.executable, "-m", "orchestrators.daemon", "--bind", "0.0.0.0"], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=180)
    assert run.returncode == 2 and run.stderr.strip().splitlines()[-1].startswith("error: the HTTP API on 0.0.0.0")
    assert not (tmp_path / "daemon.json").exists()
