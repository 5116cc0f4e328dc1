"""Servers bound beyond loopback need a token: the gRPC host refuses to start without one, and with one
refuses every worker that does not present it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from autogen_core import TypeSubscription

from actors.host import BalancingHost, BindRefused
from maxkernel.auth import is_loopback
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
                worker = await asyncio.wait_for(connect_worker(f"127.0.0.1:{port}", token=wrong), 30)
                try:
                    with pytest.raises(grpc.aio.AioRpcError) as refused:
                        await asyncio.wait_for(worker.add_subscription(TypeSubscription("tester", "probe")), 30)
                    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
                finally:
                    with contextlib.suppress(Exception):
                        await worker.stop()
            worker = await asyncio.wait_for(connect_worker(f"127.0.0.1:{port}", token="s3cret"), 30)
            await asyncio.wait_for(worker.add_subscription(TypeSubscription("tester", "probe")), 30)
            await worker.stop()
        finally:
            await host.stop()

    asyncio.run(scenario())
