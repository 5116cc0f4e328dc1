"""A warm spare takes a dead tester's place: the supervisor keeps one tester serving and one on standby
(imported, sandbox started, not registered); the serving one is killed in the middle of an evaluation,
the spare is promoted into its slot without a fresh start, the host gives it the evaluation, and the
caller gets one verdict."""

from __future__ import annotations

import pytest
import asyncio
import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

from autogen_core import AgentId

from actors import ActorConfig
from actors.host import BalancingHost
from maxkernel.messages import EvalReport, EvalRequest, KernelDraft, Plan, StrategyRef
from maxkernel.runtime import TESTER, connect_worker

from conftest import free_port, stop_all
from test_daemon_on_fleet_testers import _cpu_ticks, _evaluator_children
from test_worker_supervision import Lines, spawn

TASK = "12p_RMSNorm"
KERNEL = '''
import jax
import jax.numpy as jnp


def kernel(x, weight, *, eps):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * weight
'''


@pytest.mark.slow
def test_a_spare_takes_over_a_killed_testers_evaluation_and_it_is_judged_once(tmp_path: Path) -> None:
    config_file = tmp_path / "tester.json"
    config_file.write_text(ActorConfig(data_dir=str(tmp_path), eval_timing_rounds=2,
                                       eval_correctness_seeds=1).model_dump_json())
    address = f"127.0.0.1:{free_port()}"
    procs: list[subprocess.Popen[str]] = []

    async def scenario() -> tuple[EvalReport, BalancingHost, Lines]:
        host = BalancingHost(address)
        await host.start()
        caller = None
        try:
            # The user's command (`maxkernel worker --supervise`), which runs the same supervisor as `actors.worker`.
            supervisor = spawn(["maxkernel.cli", "worker", "--supervise", "--count", "1", "--spares", "1", "--host", address,
                                "--roles", "tester", "--config", str(config_file)], tmp_path / "testers.log")
            procs.append(supervisor)
            lines = Lines(supervisor, tmp_path / "testers.log")
            await asyncio.to_thread(lines.wait_for, "ready 0", 180)
            await asyncio.to_thread(lines.wait_for, "standby ", 180)
            serving = int(lines.wait_for("started 0 ")[0].split()[2])
            spare = int(lines.wait_for("spare ")[0].split()[1])
            assert len(host.servicer.live(TESTER)) == 1  # the spare is not registered: it gets no work
            sandbox = _evaluator_children(spare)
            assert sandbox  # and its evaluator sandbox is already started

            caller = await connect_worker(address, token="")
            plan = Plan(session_id="s1", task_id=TASK, strategies=[StrategyRef(name="rowblock")])
            draft = KernelDraft(session_id="s1", task_id=TASK, candidate_id="c1", plan=plan, source=KERNEL)
            asked = asyncio.ensure_future(caller.send_message(
                EvalRequest(session_id="s1", task_id=TASK, candidate_id="c1", draft=draft), AgentId(TESTER, "s1")))
            busy = _evaluator_children(serving)
            idle = {pid: _cpu_ticks(pid) for pid in busy}
            deadline = time.monotonic() + 120
            while not (any(host.servicer.inflight.values())
                       and any(_cpu_ticks(pid) > idle[pid] + 2 for pid in busy)):  # its sandbox is at work
                assert time.monotonic() < deadline and not asked.done(), "the evaluation never started"
                await asyncio.sleep(0.02)
            os.killpg(serving, signal.SIGKILL)
            reply = await asyncio.wait_for(asked, 180)
            return reply, host, lines
        finally:
            if caller is not None:
                with contextlib.suppress(Exception):
                    await caller.stop()
            await host.stop()

    try:
        reply, host, lines = asyncio.run(scenario())
        spare = int(lines.wait_for("spare ")[0].split()[1])
        assert isinstance(reply, EvalReport) and reply.candidate_id == "c1"
        assert reply.report.status == "ok", reply.report.reason
        assert lines.wait_for("promoted 0 ")[0] == f"promoted 0 {spare}"  # the spare took slot 0
        assert len(lines.wait_for("ready 0", count=2)) == 2  # and served it
        assert len([s for s in lines.seen if s.startswith("started ")]) == 1  # no fresh start was needed
        assert len(lines.wait_for("spare ", count=2)) == 2  # a new spare starts behind it
        assert host.servicer.redelivered == 1 and host.servicer.answered_from_report == 0  # re-run once, by the spare
    finally:
        stop_all(procs)
