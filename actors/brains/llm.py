"""The LLM brain: an autogen-agentchat ``AssistantAgent`` with tools, held inside the core actor.

Each question gets a fresh agent (the prompt carries everything the model needs); within one question
the agent keeps its context, so a reply without usable code is sent back to it with the reason.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.messages import TextMessage
from autogen_core import CancellationToken
from autogen_core.models import ChatCompletionClient

from actors.api_lookup import lookup_api
from actors.brains.base import Brain, Diagnosis, PlanOutcome, Tools, TuneOutcome, UnusableReply
from actors.brains.codeblocks import extract_kernel
from actors.profile_facts import gather
from actors.prompting import expert_block, outcomes_block, recall_block, system_prompt, task_block
from jaxbench.report import EvalReport as JudgeReport
from maxkernel.messages import EvalReport, FixRequest, OptimizeRequest, Plan, ProfileReport, Recall, StrategyRef, TuneTrial

_STRATEGY = re.compile(r"^\s*(?:[-*]|\d+[.)])?\s*STRATEGY:\s*(.+)$", re.MULTILINE)
_NOTES = re.compile(r"^\s*NOTES:\s*(.+)$", re.MULTILINE)
_BOUND = re.compile(r"^\s*BOUND:\s*(\w+)", re.MULTILINE)
_TRY = re.compile(r"^\s*TRY:\s*(.+)$", re.MULTILINE)
_GIVE_UP = re.compile(r"^\s*GIVE UP:\s*(.+)$", re.MULTILINE)


def summarize(report: JudgeReport) -> str:
    line = f"status: {report.status}; correct: {report.correct}"
    if report.reason:
        line += f"; reason: {report.reason[:3000]}"
    if report.speedup is not None:
        line += f"; kernel {report.kernel_ms} ms vs reference {report.ref_ms} ms ({report.speedup}x, {report.basis})"
    if report.max_abs_err is not None:
        line += f"; max_abs_err {report.max_abs_err:.3g}"
    return line


class LlmBrain(Brain):
    def __init__(self, role: str, services: Any, tools: Tools, client: ChatCompletionClient) -> None:
        super().__init__(role, services, tools)
        self.client = client
        self.config = services.config

    # -- the agent and its tools ------------------------------------------------------------------

    def _tools(self) -> list[Any]:
        tools = self.tools

        async def check_kernel(source: str) -> str:
            """Compile (for TPU targets: lower with Mosaic) and check correctness of a complete candidate
            file on fresh inputs; no timing. Fast: use it before answering."""
            return summarize(await tools.evaluate(source, False))

        async def evaluate_kernel(source: str) -> str:
            """Run the full judge on a complete candidate file: correctness, then timing against the reference."""
            return summarize(await tools.evaluate(source, True))

        async def recall_memory() -> str:
            """Verified kernels and notes from past sessions on tasks similar to this one."""
            return recall_block(await tools.recall())

        def lookup(name: str) -> str:
            """Signature and docstring of a JAX or Pallas name, e.g. pl.BlockSpec or pltpu.CompilerParams."""
            return lookup_api(name)

        lookup.__name__ = "lookup_api"
        return [check_kernel, evaluate_kernel, recall_memory, lookup]

    def _agent(self, system: str, with_tools: bool) -> AssistantAgent:
        tools = self._tools() if with_tools and self.client.model_info.get("function_calling") else None
        return AssistantAgent(self.role, model_client=self.client, system_message=system, tools=tools,
                              max_tool_iterations=self.config.max_tool_iterations, reflect_on_tool_use=False)

    @staticmethod
    async def _say(agent: AssistantAgent, text: str) -> str:
        response = await agent.on_messages([TextMessage(content=text, source="user")], CancellationToken())
        message = response.chat_message
        content = getattr(message, "content", "")
        return content if isinstance(content, str) else message.to_text()

    async def _ask_code(self, agent: AssistantAgent, prompt: str, allow_give_up: bool = False) -> str | None:
        reply = await self._say(agent, prompt)
        for attempt in range(self.config.max_reprompts + 1):
            if allow_give_up and _GIVE_UP.search(reply) and "```" not in reply:
                return None
            source, reason = extract_kernel(reply)
            if source is not None:
                return source
            if attempt < self.config.max_reprompts:
                reply = await self._say(agent, f"That reply cannot be used: {reason}.")
        raise UnusableReply(f"{self.role}: no usable kernel after {self.config.max_reprompts} re-prompts ({reason})")

    def _context(self) -> str:
        return task_block(self.tools.task, self.tools.target, self.tools.size)

    # -- the five questions -----------------------------------------------------------------------

    async def plan(self, request: OptimizeRequest, recall: Recall) -> PlanOutcome:
        from actors.profile_facts import CPU_RIDGE

        agent = self._agent(system_prompt("planner"), with_tools=False)
        tools = self.tools
        fared, example = await asyncio.gather(
            asyncio.to_thread(outcomes_block, self.services.memory, tools.task, tools.target),
            asyncio.to_thread(expert_block, tools.task, tools.target, tools.size))
        remembered = "\n\n".join(b for b in (recall_block(recall), fared, example) if b)
        prompt = f"{self._context()}\n\n{remembered}\n\nCPU ridge point for reference: {CPU_RIDGE} FLOP/byte."
        if request.feedback or request.exclude:
            tried = ", ".join(request.exclude) or "(none)"
            prompt += (f"\n\n## What this session has learned\n{request.feedback or '(no results yet)'}\n\n"
                       f"Strategies already tried (propose others): {tried}")
        reply = await self._say(agent, prompt)
        lines = _STRATEGY.findall(reply)
        for _ in range(self.config.max_reprompts):
            if lines:
                break
            reply = await self._say(agent, "That reply cannot be used: it has no line of the form "
                                           "`STRATEGY: <short-name> | <one line>`.")
            lines = _STRATEGY.findall(reply)
        if not lines:
            raise UnusableReply(f"planner: no STRATEGY line after {self.config.max_reprompts} re-prompts")
        strategies = []
        for line in lines:
            name, _, why = line.partition("|")
            strategies.append(StrategyRef(name=name.strip()[:80] or "llm", kind="llm", rationale=why.strip()))
        notes = "\n".join(_NOTES.findall(reply))
        return PlanOutcome(analysis=reply.strip(), strategies=strategies, notes=notes)

    async def draft(self, plan: Plan, feedback: str | None = None) -> str:
        agent = self._agent(system_prompt("coder"), with_tools=True)
        strategy = plan.current
        recall = await self.tools.recall()
        previous = f"\n\n## Latest evaluator feedback\nThe previous strategy was dropped: {feedback}" if feedback else ""
        example = await asyncio.to_thread(expert_block, self.tools.task, self.tools.target, self.tools.size)
        prompt = (f"{self._context()}\n\n{recall_block(recall)}\n\n{example}\n\n"
                  f"## Strategy\n{strategy.name}: {strategy.rationale}\n\n"
                  f"## Planner's notes\n{plan.notes or '(none)'}{previous}\n\nWrite the kernel file.")
        source = await self._ask_code(agent, prompt)
        assert source is not None
        return source

    async def fix(self, request: FixRequest) -> str | None:
        agent = self._agent(system_prompt("debugger"), with_tools=True)
        prompt = (f"{self._context()}\n\n## Failing candidate (strategy {request.draft.plan.current.name})\n"
                  f"```python\n{request.draft.source.strip()}\n```\n\n## Judge's report\n{summarize(request.report)}\n\n"
                  "Reply with the fixed file, or GIVE UP: <reason>.")
        return await self._ask_code(agent, prompt, allow_give_up=True)

    async def profile(self, report: EvalReport) -> Diagnosis:
        facts = gather(report.report)
        agent = self._agent(system_prompt("profiler"), with_tools=False)
        prompt = (f"{self._context()}\n\n## Kernel\n```python\n{report.draft.source.strip()}\n```\n\n"
                  "## Figures\n" + "\n".join(facts.lines()))
        reply = await self._say(agent, prompt)
        bound = _BOUND.search(reply)
        text = "\n".join(line for line in reply.strip().splitlines()
                         if not line.strip().startswith(("BOUND:", "TRY:"))).strip()
        return Diagnosis(bound=bound.group(1).lower() if bound else facts.bound, diagnosis=text or reply.strip(),
                         suggestions=[t.strip() for t in _TRY.findall(reply)])

    async def tune(self, profile: ProfileReport) -> TuneOutcome:
        budget = profile.draft.plan.budget
        max_variants = 3 if budget.tune_max_trials is None else budget.tune_max_trials
        if max_variants <= 0:  # tuning switched off: keep the correct kernel as it is, ask the model nothing
            return TuneOutcome(best_source=profile.draft.source, best_report=profile.report)
        agent = self._agent(system_prompt("tuner", max_variants=max_variants), with_tools=False)
        prompt = (f"{self._context()}\n\n## Correct kernel\n```python\n{profile.draft.source.strip()}\n```\n\n"
                  f"## Judge\n{summarize(profile.report)}\n\n## Profiler\nBOUND: {profile.bound}\n{profile.diagnosis}\n"
                  + "\n".join(f"TRY: {s}" for s in profile.suggestions))
        reply = await self._say(agent, prompt)
        best = TuneOutcome(best_source=profile.draft.source, best_report=profile.report)
        for chunk in reply.split("VARIANT:")[1:][:max_variants]:
            label = chunk.strip().splitlines()[0].strip() if chunk.strip() else "variant"
            source, reason = extract_kernel(chunk)
            if source is None:
                best.trials.append(TuneTrial(params={"variant": label}, status="unusable"))
                continue
            report = await self.tools.evaluate(source, True)
            best.trials.append(TuneTrial(params={"variant": label}, status=report.status, speedup=report.speedup,
                                         kernel_ms=report.kernel_ms))
            if report.passed and (report.speedup or 0.0) > (best.best_report.speedup or 0.0):
                best.best_source, best.best_report, best.best_params = source, report, {"variant": label}
        return best
