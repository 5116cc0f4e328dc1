"""An actor that thinks with a brain from config, and lends it the evaluator and memory through the bus."""

from __future__ import annotations

from autogen_core import AgentId

from actors.base import Actor
from actors.brains import Brain, Tools, make_brain
from jaxbench.report import EvalReport as JudgeReport
from maxkernel.messages import Budget, BusMessage, EvalReport, EvalRequest, KernelDraft, Plan, Recall, RecallRequest, new_id
from maxkernel.runtime import LIBRARIAN, TESTER


class BrainActor(Actor):
    def __init__(self, services, description: str = "") -> None:  # type: ignore[no-untyped-def]
        super().__init__(services, description)
        self._brain: Brain | None = None
        self._about: BusMessage | None = None

    def reset(self) -> None:
        self._brain = None
        self._about = None

    def brain(self, about: BusMessage, target: str, size: str, budget: Budget) -> Brain:
        # The brain is built once per session, but its tools must speak for the message being handled now:
        # a tuning trial belongs to the strategy (and candidate) this message is about, not the first one's.
        self._about = about
        if self._brain is None:
            kind = self.services.config.brain_for(self.role)
            client = self.services.client(about.session_id, self.role, budget) if kind == "llm" else None
            self._brain = make_brain(kind, self.role, self.services, self._tools(about, target, size), client)
        return self._brain

    def _tools(self, first: BusMessage, target: str, size: str) -> Tools:
        session_id, task_id = first.session_id, first.task_id

        async def evaluate(source: str, timing: bool) -> JudgeReport:
            about = self._about or first
            plan = about.plan if isinstance(about, KernelDraft) else getattr(getattr(about, "draft", None), "plan", None)
            if plan is None and isinstance(about, Plan):
                plan = about
            draft = KernelDraft(session_id=session_id, task_id=task_id, candidate_id=new_id(),
                                parent_id=about.candidate_id, plan=plan or _bare_plan(about, target, size),
                                source=source, produced_by=f"{self.role}:tool", sender=self.role)
            request = EvalRequest(session_id=session_id, task_id=task_id, candidate_id=draft.candidate_id,
                                  parent_id=about.candidate_id, draft=draft, timing=timing, sender=self.role)
            reply = await self.send_message(request, AgentId(TESTER, session_id))
            assert isinstance(reply, EvalReport), f"tester answered {type(reply).__name__}"
            return reply.report

        async def recall() -> Recall:
            reply = await self.send_message(RecallRequest(session_id=session_id, task_id=task_id, target=target,
                                                          sender=self.role), AgentId(LIBRARIAN, session_id))
            assert isinstance(reply, Recall), f"librarian answered {type(reply).__name__}"
            return reply

        return Tools(task=self.services.task(task_id), target=target, size=size, evaluate=evaluate, recall=recall)


def _bare_plan(about: BusMessage, target: str, size: str) -> Plan:
    from maxkernel.messages import StrategyRef

    return Plan(session_id=about.session_id, task_id=about.task_id, target=target, size=size,
                strategies=[StrategyRef(name="tool-check")])
