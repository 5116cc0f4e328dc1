"""A daemon's tester that judges nothing in its own process: the fleet's tester workers do.

Each draft a job's pipeline hands to the tester goes, as an ``EvalRequest``, through the gRPC host to the
tester workers (``maxkernel worker --roles tester``, kept alive by ``--supervise``). The host gives it to
the least-loaded live worker and, should that worker die, to another (``actors.balancer``). The verdict
comes back here and is routed and recorded exactly as a local tester's would be (failures to the
debugger, passes to the profiler, direct answers copied to the event log), so the job's record holds one
verdict per judgement however many workers died meanwhile. Edge cases, when configured, are checked by
this process's own evaluator on the verdict that came back.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import structlog
from autogen_core import AgentId

from actors.tester import Tester
from jaxbench.report import EvalReport as JudgeReport
from jaxbench.task import MODELS_DIR, SUITE_DIR
from maxkernel.messages import EvalReport, EvalRequest, KernelDraft
from maxkernel.runtime import TESTER

log = structlog.get_logger("orchestrators.fleet_tester")

CONNECT_TIMEOUT_S = 60.0


class FleetUnreachable(RuntimeError):
    """The gRPC host of the fleet's testers could not be reached (one line, naming the address)."""


class FleetLink:
    """One daemon's connection to the gRPC host, shared by the testers of all its jobs; a connection that
    failed is opened again on the next judgement."""

    def __init__(self, address: str, *, token: str | None = None, wait_s: float = 300.0) -> None:
        self.address, self.token, self.wait_s = address, token, wait_s
        self.sent = 0
        self._runtime: Any = None
        self._lock = asyncio.Lock()

    async def _connected(self) -> Any:
        async with self._lock:
            if self._runtime is None:
                from maxkernel.runtime import connect_worker

                try:
                    self._runtime = await asyncio.wait_for(connect_worker(self.address, self.token), CONNECT_TIMEOUT_S)
                except (OSError, asyncio.TimeoutError, RuntimeError) as exc:
                    raise FleetUnreachable(f"cannot reach the fleet's gRPC host at {self.address}: "
                                           f"{type(exc).__name__}: {exc}") from exc
                log.info("fleet_tester.connected", host=self.address)
            return self._runtime

    async def open(self) -> None:
        await self._connected()

    async def judge(self, draft: KernelDraft, timing: bool, task_ref: str) -> JudgeReport:
        """The fleet's verdict on ``draft``; ``task_ref`` names the task as the worker can load it."""
        runtime = await self._connected()
        sent = draft.model_copy(update={"task_id": task_ref})
        request = EvalRequest(session_id=draft.session_id, task_id=task_ref, candidate_id=draft.candidate_id,
                              parent_id=draft.parent_id, draft=sent, timing=timing, sender=TESTER)
        self.sent += 1
        try:
            reply = await asyncio.wait_for(runtime.send_message(request, AgentId(TESTER, draft.session_id)), self.wait_s)
        except asyncio.TimeoutError as exc:
            raise TimeoutError(f"no tester of the fleet at {self.address} answered within {self.wait_s:.0f} s") from exc
        except Exception:
            await self._drop(runtime)  # a broken connection: the next judgement connects again
            raise
        if not isinstance(reply, EvalReport):
            raise RuntimeError(f"the fleet's tester gave no report for candidate {draft.candidate_id} (it failed on it)")
        return reply.report

    async def _drop(self, runtime: Any) -> None:
        async with self._lock:
            if self._runtime is runtime:
                self._runtime = None
        try:
            await runtime.stop()
        except Exception as exc:  # already broken; nothing more to release
            log.debug("fleet_tester.stop_failed", error=str(exc))

    async def close(self) -> None:
        runtime, self._runtime = self._runtime, None
        if runtime is not None:
            try:
                await runtime.stop()
            except Exception as exc:
                log.debug("fleet_tester.stop_failed", error=str(exc))


def task_ref(path: Path, task_id: str) -> str:
    """How a worker names the task: a suite or model-layer task by its id, any other folder by its path."""
    resolved = path.resolve()
    shipped = any(resolved.is_relative_to(folder.resolve()) for folder in (SUITE_DIR, MODELS_DIR))
    return task_id if shipped else str(resolved)


def fleet_tester(link: FleetLink) -> type[Tester]:
    """The tester class of a daemon whose evaluations go to the fleet behind ``link``."""

    class FleetTester(Tester):
        async def judge(self, draft: KernelDraft, timing: bool) -> JudgeReport:
            task = self.services.task(draft.task_id)
            return await link.judge(draft, timing, task_ref(task.path, task.id))

    return FleetTester
