"""Tuner: searches the tunable choices of a correct kernel and scores the best one found."""

from __future__ import annotations

from autogen_core import MessageContext, message_handler

from actors.brain_actor import BrainActor
from maxkernel.messages import CandidateScored, ProfileReport, TuneReport, new_id
from maxkernel.runtime import LIBRARIAN, RECORDER, TUNER


class Tuner(BrainActor):
    role = TUNER

    @message_handler
    async def on_profile(self, message: ProfileReport, ctx: MessageContext) -> None:
        plan = message.draft.plan

        async def work() -> None:
            outcome = await self.brain(message, plan.target, plan.size, plan.budget).tune(message)
            same = outcome.best_source.strip() == message.draft.source.strip()
            candidate_id = message.candidate_id if same else new_id()
            parent_id = message.parent_id if same else message.candidate_id
            ids = dict(session_id=message.session_id, task_id=message.task_id, candidate_id=candidate_id,
                       parent_id=parent_id)
            await self.send(TuneReport(**ids, best_source=outcome.best_source, best_report=outcome.best_report,
                                       best_params=outcome.best_params, trials=outcome.trials,
                                       strategy=plan.current.name), RECORDER)
            await self.send(CandidateScored(**ids, source=outcome.best_source, report=outcome.best_report,
                                            strategy=plan.current.name, produced_by=message.draft.produced_by,
                                            diagnosis=message.diagnosis), LIBRARIAN)

        await self.guarded(message, ctx, plan.budget, work)
