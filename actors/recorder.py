"""Recorder: every bus message into the SQL store's ``events`` table, in the order it arrives.

Drafts also become rows of ``candidates`` and judged drafts rows of ``evaluations``, so the store can be
queried without replaying the log. The write is synchronous inside the handler: handlers start in arrival
order, so the log keeps the bus's order.
"""

from __future__ import annotations

import time
from typing import Any

import structlog
from autogen_core import BaseAgent, MessageContext

from actors.services import Services
from maxkernel.messages import BusMessage, EvalReport, FixRequest, KernelDraft
from maxkernel.runtime import RECORDER

log = structlog.get_logger("actors.recorder")


class Recorder(BaseAgent):
    role = RECORDER

    def __init__(self, services: Services) -> None:
        super().__init__("persists every bus message into the events table")
        self.services = services
        self.recorded = 0

    async def on_message_impl(self, message: Any, ctx: MessageContext) -> Any:
        if not isinstance(message, BusMessage):
            return None
        for attempt in range(3):
            try:
                self._write(message)
                self.recorded += 1
                return None
            except Exception as exc:  # a locked or unreachable store: try again, then say what was lost
                if attempt == 2:
                    log.error("recorder.write_failed", session=message.session_id, type=type(message).__name__,
                              error=str(exc), payload=message.model_dump_json()[:4000])
                    raise
                time.sleep(0.2 * (attempt + 1))
        return None

    def _write(self, message: BusMessage) -> None:
        store = self.services.store
        if isinstance(message, KernelDraft):
            with store.write("recording a draft") as tx:
                tx.add_candidate(message.task_id, message.source, session_id=message.session_id,
                                 parent_id=message.parent_id, strategy=message.plan.current.name,
                                 produced_by=message.produced_by, id=message.candidate_id)
        if isinstance(message, (EvalReport, FixRequest)) and not message.draft.produced_by.endswith(":tool"):
            store.add_evaluation(message.candidate_id or message.draft.candidate_id, message.report)
        store.append_event(message, session_id=message.session_id, correlation_id=message.parent_id,
                           task_id=message.task_id, candidate_id=message.candidate_id)

    async def save_state(self) -> dict[str, Any]:
        return {"recorded": self.recorded}

    async def load_state(self, state: Any) -> None:
        self.recorded = int(state.get("recorded", 0))
