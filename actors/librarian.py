"""Librarian: answers recall requests from the vector memory; remembers scored kernels that passed the
full evaluator, with a note on how they fared; then closes the session's optimization."""

from __future__ import annotations

import asyncio

import structlog
from autogen_core import MessageContext, message_handler

from actors.base import Actor
from jaxbench.report import format_speedup
from maxkernel.messages import Budget, CandidateScored, Note, Recall, RecalledKernel, RecalledNote, RecallRequest
from maxkernel.runtime import LIBRARIAN, RECORDER

log = structlog.get_logger("actors.librarian")


class Librarian(Actor):
    role = LIBRARIAN

    @message_handler
    async def on_recall(self, message: RecallRequest, ctx: MessageContext) -> Recall:
        ids = dict(session_id=message.session_id, task_id=message.task_id, sender=self.role)
        try:
            recall = await asyncio.to_thread(self._recall, message)
            await self.send(recall, RECORDER)  # a direct answer is not on a topic: copy it to the event log
            return recall
        except Exception as exc:  # recall is advice: a session goes on without it, but says so
            error = f"recall failed: {type(exc).__name__}: {exc}"
            log.warning("librarian.recall_failed", session=message.session_id, error=error)
            await self.send(Note(**ids, text=error, outcome="failed"), RECORDER)
            return Recall(**ids)

    def _recall(self, message: RecallRequest) -> Recall:
        memory = self.services.memory
        task = self.services.task(message.task_id)
        kernels = [RecalledKernel(id=h.kernel.id, task_id=h.kernel.task_id, score=h.score, strategy=h.kernel.strategy,
                                  speedup=h.kernel.speedup, speedup_ci=h.kernel.report.interval,
                                  code=h.kernel.code)
                   for h in memory.recall_kernels(task, k=message.k, target=message.target)]
        notes = [RecalledNote(id=h.note.id, score=h.score, outcome=h.note.outcome, text=h.note.text)
                 for h in memory.recall_notes(task, k=message.k, target=message.target)]
        return Recall(session_id=message.session_id, task_id=message.task_id, kernels=kernels, notes=notes,
                      sender=self.role)

    @message_handler
    async def on_scored(self, message: CandidateScored, ctx: MessageContext) -> None:
        async def work() -> None:
            if self.services.config.remember and message.report.passed:
                note = await asyncio.to_thread(self._remember, message)
                await self.send(Note(session_id=message.session_id, task_id=message.task_id,
                                     candidate_id=message.candidate_id, text=note,
                                     outcome="worked" if (message.report.speedup or 0) > 1 else "info",
                                     target=message.report.target), RECORDER)
            await self.finish(message, "scored", f"{message.strategy}: {message.report.status}, "
                                                 f"speedup {format_speedup(message.report.speedup, message.report.interval)}",
                              best=message)

        await self.guarded(message, ctx, Budget(), work)

    def _remember(self, message: CandidateScored) -> str:
        memory = self.services.memory
        task = self.services.task(message.task_id)
        report = message.report
        memory.remember_kernel(report, message.source, task=task, strategy=message.strategy,
                               produced_by=message.produced_by, session_id=message.session_id,
                               candidate_id=message.candidate_id, parent_id=message.parent_id)
        text = scored_note(message)
        outcome = "worked" if (report.speedup or 0) > 1 else "info"
        memory.remember_note(text, task=task, outcome=outcome, target=report.target, session_id=message.session_id)
        return text


def scored_note(message: CandidateScored) -> str:
    """The note remembered with a scored kernel: its speedup with its interval (``format_speedup``) and basis."""
    report = message.report
    return (f"{message.strategy} on {report.target}: {format_speedup(report.speedup, report.interval)} "
            f"({report.basis}), kernel {report.kernel_ms} ms vs reference {report.ref_ms} ms. {message.diagnosis}")[:2000]
