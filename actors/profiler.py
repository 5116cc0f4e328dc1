"""Profiler: turns the judge's timings, XLA cost analysis and the cost model into a short diagnosis."""

from __future__ import annotations

from autogen_core import MessageContext, message_handler

from actors.brain_actor import BrainActor
from maxkernel.messages import EvalReport, ProfileReport
from maxkernel.runtime import PROFILER, TUNER


class Profiler(BrainActor):
    role = PROFILER

    @message_handler
    async def on_report(self, message: EvalReport, ctx: MessageContext) -> None:
        plan = message.draft.plan

        async def work() -> None:
            diagnosis = await self.brain(message, plan.target, plan.size, plan.budget).profile(message)
            await self.send(ProfileReport(session_id=message.session_id, task_id=message.task_id,
                                          candidate_id=message.candidate_id, parent_id=message.parent_id,
                                          draft=message.draft, report=message.report, bound=diagnosis.bound,
                                          diagnosis=diagnosis.diagnosis, suggestions=diagnosis.suggestions), TUNER)

        await self.guarded(message, ctx, plan.budget, work)
