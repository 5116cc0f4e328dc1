"""Debugger: fixes a draft from the evaluator's message, or abandons the strategy after its attempts."""

from __future__ import annotations

from autogen_core import MessageContext, message_handler

from actors.brain_actor import BrainActor
from actors.brains.base import FixedDraft, UnusableReply
from maxkernel.messages import DraftAbandoned, FixRequest, KernelDraft, Plan, new_id
from maxkernel.runtime import CODER, DEBUGGER, TESTER


def plan_with(plan: Plan, fixed: FixedDraft) -> Plan:
    """``plan`` with its current strategy at the fix's parameters (and nothing left to fall back to)."""
    current = plan.current.model_copy(update={"params": dict(fixed.params), "defaults": {},
                                              "rationale": f"{plan.current.rationale} [{fixed.why}]"})
    strategies = list(plan.strategies)
    strategies[plan.step] = current
    return plan.model_copy(update={"strategies": strategies})


class Debugger(BrainActor):
    role = DEBUGGER

    @message_handler
    async def on_fix(self, message: FixRequest, ctx: MessageContext) -> None:
        plan = message.draft.plan

        async def work() -> None:
            report = message.report
            why = f"{report.status}: {report.reason[:500]}"
            if message.draft.attempt >= plan.budget.max_fix_attempts:
                await self._abandon(message, f"not fixed after {message.draft.attempt} attempts; last {why}")
                return
            brain = self.brain(message, plan.target, plan.size, plan.budget)
            try:
                fixed = await brain.fix(message)
            except UnusableReply as exc:
                fixed, why = None, f"{why}; {exc}"
            fixed_plan = plan
            if isinstance(fixed, FixedDraft):  # new parameters: the plan carries them (the tuner starts there)
                fixed_plan, fixed = plan_with(plan, fixed), fixed.source
            if fixed is None or fixed.strip() == message.draft.source.strip():
                await self._abandon(message, f"no fix for {why}")
                return
            kind = self.services.config.brain_for(self.role)
            draft = KernelDraft(session_id=message.session_id, task_id=message.task_id, candidate_id=new_id(),
                                parent_id=message.candidate_id, plan=fixed_plan, source=fixed,
                                attempt=message.draft.attempt + 1, produced_by=f"debugger:{kind}")
            await self.send(draft, TESTER)

        await self.guarded(message, ctx, plan.budget, work)

    async def _abandon(self, message: FixRequest, reason: str) -> None:
        await self.send(DraftAbandoned(session_id=message.session_id, task_id=message.task_id,
                                       candidate_id=message.candidate_id, plan=message.draft.plan, reason=reason), CODER)
