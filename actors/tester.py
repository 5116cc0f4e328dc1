"""Tester: drives the evaluator. Drafts from the coder and debugger are judged and routed (failures to the
debugger, passes to the profiler); ``EvalRequest`` is answered directly (tools and tuning trials).

With ``edge_cases`` in the actor config, a draft that passes is also judged on those extra inputs
(``actors.edge_cases``); a failure there fails the draft, with the case named in the reason.
"""

from __future__ import annotations

import asyncio
import time

from autogen_core import MessageContext, message_handler

from actors.base import Actor
from actors.edge_cases import CASES, edge_task
from jaxbench.report import EvalReport as JudgeReport
from maxkernel.evaluation import evaluate_candidate
from maxkernel.messages import EvalReport, EvalRequest, FixRequest, KernelDraft
from maxkernel.runtime import DEBUGGER, PROFILER, RECORDER, TESTER

class Tester(Actor):
    role = TESTER

    async def judge(self, draft: KernelDraft, timing: bool) -> JudgeReport:
        task = self.services.task(draft.task_id)
        plan = draft.plan
        evaluator = self.services.evaluator if timing else self.services.untimed_evaluator
        began = time.monotonic()
        report = await asyncio.to_thread(evaluate_candidate, task, draft.source, plan.target, plan.size,
                                         f"candidate_{draft.candidate_id}.py", evaluator)
        # The whole judgement (a TPU target's lowering included) is what a further trial would cost.
        report.duration_s = round(max(report.duration_s, time.monotonic() - began), 3)
        return report

    async def edge_check(self, draft: KernelDraft, report: JudgeReport) -> JudgeReport:
        """Judge a passing draft on the configured edge cases; the first failure fails the report."""
        from jaxbench.report import CheckResult

        task = self.services.task(draft.task_id)
        root = self.services.settings.data_path / "edge_cases"
        for case in self.services.config.edge_cases:
            edge = edge_task(task, case, root)
            result = await asyncio.to_thread(evaluate_candidate, edge, draft.source, draft.plan.target,
                                             draft.plan.size, f"candidate_{draft.candidate_id}.py",
                                             self.services.untimed_evaluator)
            report.checks.append(CheckResult(name=f"edge_{case}", passed=result.passed,
                                             detail=result.reason[:500]))
            if not result.passed:
                report.status, report.correct = result.status, False
                report.reason = f"edge case {case!r} ({CASES[case][0]} on float inputs): {result.reason}"
                break
        return report

    @message_handler
    async def on_draft(self, message: KernelDraft, ctx: MessageContext) -> None:
        async def work() -> None:
            report = await self.judge(message, True)
            if report.passed and self.services.config.edge_cases:
                report = await self.edge_check(message, report)
            ids = dict(session_id=message.session_id, task_id=message.task_id, candidate_id=message.candidate_id,
                       parent_id=message.parent_id)
            if report.passed:
                await self.send(EvalReport(**ids, draft=message, report=report), PROFILER)
            else:
                await self.send(FixRequest(**ids, draft=message, report=report), DEBUGGER)

        await self.guarded(message, ctx, message.plan.budget, work)

    @message_handler
    async def on_request(self, message: EvalRequest, ctx: MessageContext) -> EvalReport | None:
        async def work() -> EvalReport:
            report = await self.judge(message.draft, message.timing)
            reply = EvalReport(session_id=message.session_id, task_id=message.task_id,
                               candidate_id=message.candidate_id, parent_id=message.parent_id, draft=message.draft,
                               report=report)
            await self.send(reply, RECORDER)  # a direct answer is not on a topic: copy it to the event log
            return reply

        return await self.guarded(message, ctx, message.draft.plan.budget, work)
