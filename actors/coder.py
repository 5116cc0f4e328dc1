"""Coder: turns the plan's current strategy into a candidate file; moves on when a strategy is abandoned."""

from __future__ import annotations

from autogen_core import MessageContext, message_handler

from actors.brain_actor import BrainActor
from actors.brains.base import UnusableReply
from maxkernel.messages import DraftAbandoned, KernelDraft, Plan, new_id
from maxkernel.runtime import CODER, TESTER


class Coder(BrainActor):
    role = CODER

    @message_handler
    async def on_plan(self, message: Plan, ctx: MessageContext) -> None:
        await self.guarded(message, ctx, message.budget, lambda: self._draft_from(message, None))

    @message_handler
    async def on_abandoned(self, message: DraftAbandoned, ctx: MessageContext) -> None:
        plan = message.plan
        await self.guarded(message, ctx, plan.budget,
                           lambda: self._draft_from(plan.model_copy(update={"step": plan.step + 1}), message.reason))

    async def _draft_from(self, plan: Plan, last_reason: str | None) -> None:
        """Draft the plan's current strategy; a strategy the brain cannot write is skipped with its reason."""
        while plan.step < len(plan.strategies):
            brain = self.brain(plan, plan.target, plan.size, plan.budget)
            try:
                source = await brain.draft(plan, last_reason)
            except UnusableReply as exc:
                last_reason = str(exc)
                plan = plan.model_copy(update={"step": plan.step + 1})
                continue
            kind = self.services.config.brain_for(self.role)
            draft = KernelDraft(session_id=plan.session_id, task_id=plan.task_id, candidate_id=new_id(), plan=plan,
                                source=source, produced_by=f"coder:{kind}:{plan.current.name}")
            await self.send(draft, TESTER)
            return
        await self.finish(plan, "failed", f"every strategy failed; last: {last_reason or 'none tried'}")
