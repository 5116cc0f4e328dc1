"""Planner: recalls what memory knows, asks its brain for strategies, hands the plan to the coder."""

from __future__ import annotations

from autogen_core import MessageContext, message_handler

from actors.brain_actor import BrainActor
from actors.brains.base import UnusableReply
from maxkernel.messages import OptimizeRequest, Plan
from maxkernel.runtime import CODER, PLANNER


class Planner(BrainActor):
    role = PLANNER

    @message_handler
    async def on_request(self, message: OptimizeRequest, ctx: MessageContext) -> None:
        async def work() -> None:
            brain = self.brain(message, message.target, message.size, message.budget)
            recall = await brain.tools.recall()
            try:
                outcome = await brain.plan(message, recall)
            except UnusableReply as exc:
                await self.finish(message, "failed", str(exc))
                return
            if not outcome.strategies:
                reason = ("the planner proposed nothing that was not tried already" if message.exclude
                          else "the planner found no strategy for this task")
                await self.finish(message, "failed", reason)
                return
            plan = Plan(session_id=message.session_id, task_id=message.task_id, target=message.target,
                        size=message.size, budget=message.budget, analysis=outcome.analysis,
                        strategies=outcome.strategies, notes=outcome.notes,
                        recalled=[k.id for k in recall.kernels] + [n.id for n in recall.notes])
            await self.send(plan, CODER)

        await self.guarded(message, ctx, message.budget, work)
