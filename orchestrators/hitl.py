"""HITL: a terminal chat in which the agents propose and a person decides.

Each step runs one actor (``orchestrators.stepper``) and shows what it proposes: a plan, a kernel (as a
diff against the previous one), a fix, a tuning result. The person approves, edits it in ``$EDITOR``, or
rejects it. Every proposal and decision is a ``HumanPrompt``/``HumanDecision`` in the event log, and the
chat's state is rebuilt from that log on ``--resume``. Free text goes to the LLM brain as guidance for
the next steps; with the rules brain only commands are understood.
"""

from __future__ import annotations

import asyncio
import difflib
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel, Field

from actors import policy
from actors.config import ActorConfig
from actors.services import Services
from jaxbench.report import EvalReport as JudgeReport, format_speedup
from maxkernel.messages import (
    Budget,
    BusMessage,
    CandidateScored,
    DraftAbandoned,
    EvalReport,
    FixRequest,
    HumanDecision,
    HumanPrompt,
    KernelDraft,
    OptimizeRequest,
    Plan,
    ProfileReport,
    SessionFinished,
    message_from_event,
    new_id,
)
from maxkernel.runtime import CODER, DEBUGGER, PLANNER, PROFILER, TUNER
from orchestrators.auto import brain_label
from orchestrators.stepper import ask_tester, record, step

HELP = """commands:
  plan                 the planner proposes strategies (memory first)
  implement [N]        the coder writes strategy N of the plan (default: the current one)
  validate             compile and check correctness of the current kernel (no timing)
  test                 the full judge: correctness and timing
  fix                  the debugger proposes a fix for the last failure
  profile              the profiler's diagnosis of the current kernel
  tune                 the tuner searches the current kernel's parameters
  accept               remember the current kernel (it must have passed the judge)
  undo                 take back the last approved step
  show [plan|kernel|report|budget]   what the session holds now (budget: what is spent and left)
  history              every proposal and decision so far
  help                 this list
  quit                 leave (the session resumes with --resume ID)
Anything else is guidance for the LLM brain."""

ASK = "approve, edit or reject? [a/e/r] "


class State(BaseModel):
    """What the chat holds now; each approved step pushes a copy so that ``undo`` can go back."""

    plan: Plan | None = None
    draft: KernelDraft | None = None
    report: JudgeReport | None = None
    failure: FixRequest | None = None
    profile: ProfileReport | None = None
    accepted: str | None = None
    guidance: list[str] = Field(default_factory=list)
    last_step: str = Field("", description="what the step that led to this state was (what undo takes back)")


class ChatLimits(BaseModel):
    """A chat's ``--budget SECONDS`` and ``--evals N``: the seconds the agents may work in one sitting (the
    person's own time is not counted) and the evaluations the session may spend in all (tests, tuning
    trials, re-measurements before an accept), counted from its event log. None: no limit."""

    time_s: float | None = None
    max_evaluations: int | None = None

    def given(self, other: "ChatLimits") -> "ChatLimits":
        """These limits with ``other``'s where it sets one (a resume can extend the budget)."""
        return self.model_copy(update={k: v for k, v in other.model_dump().items() if v is not None})

    def text(self) -> str:
        parts = [f"{self.time_s:g} s of agent work" if self.time_s is not None else "",
                 f"{self.max_evaluations} evaluations" if self.max_evaluations is not None else ""]
        return ", ".join(p for p in parts if p) or "no limit"


LIMITS = "limits "
BUDGETED = ("plan", "implement", "validate", "test", "fix", "profile", "tune", "accept")  # steps that make agents work


class Chat:
    def __init__(self, services: Services, task_id: str, session_id: str, target: str = "cpu",
                 read: Callable[[str], str] = input, write: Callable[[str], None] = print) -> None:
        self.services, self.session_id, self.target = services, session_id, target
        self.task = services.task(task_id)
        self.read, self.write = read, write
        self.state = State()
        self.undo_stack: list[State] = []
        self.history: list[str] = []
        self.llm = services.config.brain == "llm"
        self.budget = Budget(tune_max_trials=None, tune_budget_s=policy.STEP_TUNE_S)
        self.limits = ChatLimits()
        self.worked_s = 0.0  # the agents' working time in this sitting

    # -- persistence ----------------------------------------------------------------------------

    def ids(self, **extra: Any) -> dict[str, Any]:
        return dict(session_id=self.session_id, task_id=self.task.id, sender="human") | extra

    async def log_prompt(self, kind: str, message: BaseModel | None) -> None:
        subject = {"kind": kind, "message": message.model_dump(mode="json") if message else None,
                   "type": type(message).__name__ if message else None}
        await record(self.services, HumanPrompt(**self.ids(), question=f"{kind}?", subject=subject))

    async def log_decision(self, decision: str, text: str, edited: str | None = None, what: str = "") -> None:
        """Record a decision; ``what`` (the step in words) goes into the history beside it."""
        await record(self.services, HumanDecision(**self.ids(), decision=decision, text=text,  # type: ignore[arg-type]
                                                  edited_source=edited))
        self.history.append(history_line(decision, text, what))

    def restore(self) -> int:
        """Rebuild the state from the event log: replay every prompt and the decision that answered it."""
        events = self.services.store.events(session_id=self.session_id)
        pending: dict[str, Any] | None = None
        for event in events:
            if event.message_type == "HumanPrompt":
                pending = event.payload["subject"]
            elif event.message_type == "HumanDecision":
                d = event.payload
                what = ""
                if d["text"] == "undo":
                    what = f"took back {self._undo() or 'nothing'}"
                elif d["text"].startswith(LIMITS):
                    self.limits = ChatLimits.model_validate_json(d["text"][len(LIMITS):])
                    what = f"budget: {self.limits.text()}"
                elif d["text"].startswith("guidance:"):
                    self.state.guidance.append(d["text"][len("guidance:"):].strip())
                elif d["text"].startswith("accepted"):
                    self._accepted(d["text"].split()[2])
                    what = self.state.last_step
                elif d["decision"] in ("approve", "edit") and pending and pending.get("message"):
                    edited_id = d["text"].split()[-1] if d["decision"] == "edit" else None
                    self._apply(pending["kind"], _message(pending), d.get("edited_source"), edited_id)
                    what = self.state.last_step
                self.history.append(history_line(d["decision"], d["text"], what))
                pending = None
        return len(events)

    # -- state changes --------------------------------------------------------------------------

    def _push(self) -> None:
        self.undo_stack.append(self.state.model_copy(deep=True))

    def _undo(self) -> str | None:
        """Go back one approved step; what it was, or None when there is nothing to undo."""
        if not self.undo_stack:
            return None
        undone = self.state.last_step or "a step"
        self.state = self.undo_stack.pop()
        return undone

    def _accepted(self, kernel_id: str) -> None:
        """Accepting is a step like the others: undo takes it back."""
        self._push()
        self.state.accepted = kernel_id
        draft = self.state.draft
        self.state.last_step = f"accept of {step_text('kernel', draft)} as kernel {kernel_id}" if draft else "accept"

    def _apply(self, kind: str, message: Any, edited: str | None, edited_id: str | None = None) -> None:
        self._push()
        if kind == "plan":
            self.state.plan = message
        elif kind in ("kernel", "fix"):
            if edited is not None:
                message = message.model_copy(update={"source": edited, "produced_by": "human",
                                                     "parent_id": message.candidate_id, "candidate_id": edited_id})
            self.state.draft, self.state.report, self.state.failure, self.state.profile = message, None, None, None
        elif kind == "report":
            self.state.report = message.report
            self.state.failure = None if message.report.passed else FixRequest(
                session_id=message.session_id, task_id=message.task_id, candidate_id=message.draft.candidate_id,
                parent_id=message.draft.parent_id, draft=message.draft, report=message.report, sender="human")
        elif kind == "profile":
            self.state.profile = message
        elif kind == "tune":
            draft = self.state.draft
            assert draft is not None
            self.state.draft = draft.model_copy(update={"source": message.source, "candidate_id": message.candidate_id,
                                                        "parent_id": draft.candidate_id, "produced_by": "tuner"})
            self.state.report = message.report
        self.state.last_step = step_text(kind, message, edited is not None)

    # -- the budget -----------------------------------------------------------------------------

    async def set_limits(self, limits: ChatLimits) -> None:
        """Take ``limits`` and record them in the log, so that a resume holds the same budget."""
        if limits == self.limits:
            return
        self.limits = limits
        await self.log_decision("redirect", LIMITS + limits.model_dump_json(), what=f"budget: {limits.text()}")

    def evaluations(self) -> int:
        """Evaluations the session has spent, from its event log (every judge call, over every sitting)."""
        return sum(1 for e in self.services.store.events(session_id=self.session_id)
                   if e.message_type in ("EvalReport", "FixRequest"))

    def evaluations_left(self) -> int | None:
        if self.limits.max_evaluations is None:
            return None
        return max(0, self.limits.max_evaluations - self.evaluations())

    def time_left(self) -> float | None:
        return None if self.limits.time_s is None else self.limits.time_s - self.worked_s

    def spent(self, evaluations: int = 0) -> str | None:
        """Why a step may not start (the time is up, or fewer than ``evaluations`` are left), else None."""
        left_s = self.time_left()
        if left_s is not None and left_s <= 0:
            return (f"time budget of {self.limits.time_s:g} s spent ({self.worked_s:.0f} s of agent work): "
                    "quit and resume to go on")
        left = self.evaluations_left()
        if evaluations and left is not None and left < evaluations:
            return (f"evaluation budget spent ({self.evaluations()} of {self.limits.max_evaluations}): "
                    "quit and resume with a larger --evals")
        return None

    def budget_text(self) -> str:
        return (f"budget: {self.limits.text()}; spent: {self.evaluations()} evaluations, "
                f"{self.worked_s:.0f} s of agent work in this sitting")

    # -- asking the person ----------------------------------------------------------------------

    def edit(self, text: str, suffix: str) -> str:
        editor = os.environ.get("EDITOR") or os.environ.get("VISUAL") or "vi"
        with tempfile.NamedTemporaryFile("w", suffix=suffix, delete=False) as fh:
            fh.write(text)
            path = fh.name
        try:
            subprocess.run([*shlex.split(editor), path], check=True)
            return Path(path).read_text()
        finally:
            os.unlink(path)

    async def decide(self, kind: str, message: BusMessage, shown: str, editable: str | None, suffix: str = ".py") -> bool:
        """Show a proposal, log it, and apply the person's answer; True when it was taken."""
        self.write(shown)
        await self.log_prompt(kind, message)
        while True:
            answer = self.read(ASK).strip().lower()[:1]
            if answer == "a":
                self._apply(kind, message, None)
                await self.log_decision("approve", kind, what=self.state.last_step)
                return True
            if answer == "e" and editable is not None:
                edited = self.edit(editable, suffix)
                if kind == "plan":
                    message = _edited_plan(message, edited)  # type: ignore[arg-type]
                    await self.log_prompt(kind, message)
                    self._apply(kind, message, None)
                    await self.log_decision("edit", kind, what=self.state.last_step)
                else:
                    edited_id = new_id()
                    self._apply(kind, message, edited, edited_id)
                    await self.log_decision("edit", f"{kind} as {edited_id}", edited, what=self.state.last_step)
                self.write(f"{kind} edited and taken")
                return True
            if answer == "r":
                await self.log_decision("redirect", f"{kind} rejected")
                self.write(f"{kind} rejected")
                return False
            self.write("answer a, e or r" + ("" if editable is not None else " (this one cannot be edited)"))

    # -- the steps ------------------------------------------------------------------------------

    async def do_plan(self, _arg: str) -> None:
        request = OptimizeRequest(**self.ids(), target=self.target, size="cpu", brain=brain_label(self.services.config),
                                  budget=self.budget)
        out = await step(self.services, PLANNER, request, (Plan, SessionFinished))
        if isinstance(out, SessionFinished):
            self.write(f"the planner gave up: {out.reason}")
            return
        assert isinstance(out, Plan)
        if self.state.guidance:
            out = out.model_copy(update={"notes": "\n".join([out.notes, "Guidance from the person:", *self.state.guidance]).strip()})
        await self.decide("plan", out, plan_text(out), plan_text(out), ".txt")

    async def do_implement(self, arg: str) -> None:
        plan = self.need("plan")
        if plan is None:
            return
        index = int(arg) - 1 if arg.strip().isdigit() else plan.step
        if not 0 <= index < len(plan.strategies):
            self.write(f"the plan has strategies 1..{len(plan.strategies)}")
            return
        chosen = plan.model_copy(update={"step": index, "message_id": new_id()})
        out = await step(self.services, CODER, chosen, (KernelDraft, SessionFinished))
        if isinstance(out, SessionFinished):
            self.write(f"the coder could not write it: {out.reason}")
            return
        assert isinstance(out, KernelDraft)
        await self.decide("kernel", out, self.diff(out.source), out.source)

    async def do_test(self, _arg: str, timing: bool = True) -> None:
        draft = self.need("draft")
        if draft is None:
            return
        refused = await asyncio.to_thread(self.spent, 1)
        if refused:
            self.write(refused)
            return
        if await asyncio.to_thread(_unrecorded, self.services, draft.candidate_id):
            await record(self.services, draft)  # an edited or tuned kernel becomes a candidate of the session
        out = await ask_tester(self.services, draft, timing)
        assert isinstance(out, EvalReport)
        self.write(report_text(out.report))
        await self.log_prompt("report", out)
        self._apply("report", out, None)
        await self.log_decision("approve", "report", what=self.state.last_step)

    async def do_validate(self, arg: str) -> None:
        await self.do_test(arg, timing=False)

    async def do_fix(self, _arg: str) -> None:
        failure = self.state.failure
        if failure is None:
            self.write("nothing to fix: test a kernel first (the last one did not fail)")
            return
        out = await step(self.services, DEBUGGER, failure.model_copy(update={"message_id": new_id()}),
                         (KernelDraft, DraftAbandoned, SessionFinished))
        if not isinstance(out, KernelDraft):
            self.write(f"the debugger has no fix: {getattr(out, 'reason', '')}")
            return
        await self.decide("fix", out, self.diff(out.source), out.source)

    async def do_profile(self, _arg: str) -> None:
        if self.state.report is None or not self.state.report.passed or self.state.draft is None:
            self.write("profile needs a kernel that passed the judge: run test first")
            return
        message = EvalReport(**self.ids(candidate_id=self.state.draft.candidate_id), draft=self.state.draft,
                             report=self.state.report)
        out = await step(self.services, PROFILER, message, (ProfileReport,))
        assert isinstance(out, ProfileReport)
        self.write(f"bound: {out.bound}\n{out.diagnosis}\n" + "\n".join(f"try: {s}" for s in out.suggestions))
        await self.log_prompt("profile", out)
        self._apply("profile", out, None)
        await self.log_decision("approve", "profile", what=self.state.last_step)

    async def do_tune(self, _arg: str) -> None:
        profile = self.state.profile
        if profile is None:
            self.write("tune needs a profile: run profile first")
            return
        refused = await asyncio.to_thread(self.spent, 1)
        if refused:
            self.write(refused)
            return
        out = await step(self.services, TUNER, await asyncio.to_thread(self.bounded, profile),
                         (CandidateScored, SessionFinished), timeout_s=900)
        if not isinstance(out, CandidateScored):
            self.write(f"tuning ended: {getattr(out, 'reason', '')}")
            return
        draft = self.state.draft
        if draft is not None and out.source.strip() == draft.source.strip():
            self.write("tuning found nothing better than the current kernel: it stays as it is")
            return
        self.write(f"tuned: {format_speedup(out.report.speedup, out.report.interval)} ({out.report.status})")
        await self.decide("tune", out, self.diff(out.source), None)

    def bounded(self, profile: ProfileReport) -> ProfileReport:
        """The profile handed to the tuner, its trials and seconds cut to what the budget has left."""
        budget = profile.draft.plan.budget
        left, left_s = self.evaluations_left(), self.time_left()
        update: dict[str, Any] = {}
        if left is not None:
            update["tune_max_trials"] = min(left, budget.tune_max_trials or left)
        if left_s is not None:
            update["tune_budget_s"] = max(0.0, min(budget.tune_budget_s, left_s))
        plan = profile.draft.plan.model_copy(update={"budget": budget.model_copy(update=update)})
        draft = profile.draft.model_copy(update={"plan": plan})
        return profile.model_copy(update={"message_id": new_id(), "draft": draft})

    async def do_accept(self, _arg: str) -> None:
        draft, report = self.state.draft, self.state.report
        if draft is None or report is None or not report.passed:
            self.write("accept needs a kernel that passed the judge")
            return
        report, how = await self.confirm(draft, report)
        if report is None:
            return
        memory = self.services.memory
        kernel = await asyncio.to_thread(memory.remember_kernel, report, draft.source, task=self.task,
                                         strategy=draft.plan.current.name, produced_by=draft.produced_by,
                                         session_id=self.session_id, candidate_id=draft.candidate_id)
        self._accepted(kernel.id)
        await self.log_decision("approve", f"accepted kernel {kernel.id} candidate {draft.candidate_id}",
                                what=self.state.last_step)
        await asyncio.to_thread(self.services.store.set_session_status, self.session_id, "accepted")
        measured = policy.needs_confirmation(report)  # then the reference was measured too: say it over that
        over = policy.cleared(report, policy.baseline_of(self.baseline_runs())) if measured else None
        self.write(f"accepted: {policy.describe(report.speedup, report.interval, over)} ({how}), "
                   f"remembered as {kernel.id}")

    def baseline_runs(self) -> list[JudgeReport]:
        """This session's runs of the reference as a candidate, read from its record (so a resumed chat has
        them too)."""
        from orchestrators.auto import messages_of

        return [m.report for m in messages_of(self.services.store, [self.session_id])
                if isinstance(m, EvalReport) and m.draft.produced_by == policy.BASELINE]

    async def measure_baseline(self, draft: KernelDraft) -> bool:
        """The reference run as a candidate, as Auto runs it (re-measured while its reading is suspect), once
        per session: the bar a kernel's confirmed reading must clear, and what "faster" is said over. False
        when the budget refuses a run or a run fails (the kernel is then not accepted)."""
        from maxkernel.rules.strategy import reference_source
        from orchestrators.auto import reference_ref

        runs = self.baseline_runs()
        while policy.baseline_more(runs):
            refused = await asyncio.to_thread(self.spent, 1)
            if refused:
                self.write(f"not accepted: the reference must be measured as a candidate first, and the {refused}")
                return False
            # its own one-strategy plan, at its step 0 (the draft's plan may be at any step of its own list)
            plan = draft.plan.model_copy(update={"strategies": [reference_ref(self.target)], "step": 0,
                                                 "message_id": new_id()})
            baseline = draft.model_copy(update={"source": reference_source(self.task), "produced_by": policy.BASELINE,
                                                "candidate_id": new_id(), "parent_id": None, "plan": plan,
                                                "message_id": new_id(), "sender": "human"})
            await record(self.services, baseline)  # a candidate of the session, as Auto's baseline is
            out = await ask_tester(self.services, baseline, True)
            assert isinstance(out, EvalReport)
            if not out.report.passed:
                self.write(f"not accepted: the reference failed as a candidate: {out.report.status}: "
                           f"{out.report.reason[:300]}")
                return False
            runs.append(out.report)
        return True

    async def confirm(self, draft: KernelDraft, report: JudgeReport) -> tuple[JudgeReport | None, str]:
        """Measure the kernel again before it is accepted, against the bar of the reference's own reading as
        Auto does (``actors.policy``): the confirmed report, or None when a run fails or the budget refuses one."""
        if not policy.needs_confirmation(report):
            return report, f"{report.basis}, deterministic"
        wanted = 1 + (not self.baseline_runs())  # a re-run, and the reference's first run unless it has one
        refused = await asyncio.to_thread(self.spent, wanted)
        if not refused and await self.measure_baseline(draft):
            refused = await asyncio.to_thread(self.spent, 1)  # a suspect reference may have taken more runs
        elif not refused:
            return None, ""
        if refused:  # a measured kernel is never accepted on its first reading alone
            self.write(f"not accepted: it must be measured again first, and the {refused}")
            return None, ""
        bar, _ = policy.baseline_bar(self.baseline_runs())
        runs, reports = [policy.lower(report)], [report]
        while policy.confirm_more(runs, bar) and not (len(runs) > 1 and await asyncio.to_thread(self.spent, 1)):
            out = await ask_tester(self.services, draft.model_copy(update={"produced_by": policy.CONFIRM}), True)
            assert isinstance(out, EvalReport)
            if not out.report.passed:
                self.write(f"not accepted: a re-run failed: {out.report.status}: {out.report.reason[:300]}")
                return None, ""
            runs.append(policy.lower(out.report))
            reports.append(out.report)
        value = policy.confirmed(runs)
        return reports[runs.index(value)], f"confirmed, {policy.confirmation_label(runs)}"

    async def do_undo(self, _arg: str) -> None:
        undone = self._undo()
        if undone is not None:
            await self.log_decision("redirect", "undo", what=f"took back {undone}")
            self.write(f"undone: {undone}")
        else:
            self.write("nothing to undo")

    async def do_show(self, arg: str) -> None:
        what = arg.strip() or "kernel"
        if what == "plan" and self.state.plan:
            self.write(plan_text(self.state.plan))
        elif what == "kernel" and self.state.draft:
            self.write(self.state.draft.source)
        elif what == "report" and self.state.report:
            self.write(report_text(self.state.report))
        elif what == "budget":
            self.write(await asyncio.to_thread(self.budget_text))
        else:
            self.write(f"no {what} yet")

    async def do_history(self, _arg: str) -> None:
        self.write("\n".join(f"{i + 1}. {h}" for i, h in enumerate(self.history)) or "nothing yet")

    async def do_help(self, _arg: str) -> None:
        self.write(HELP)

    async def guidance(self, text: str) -> None:
        if not self.llm:
            self.write("the rules brain understands commands only; type help")
            return
        self.state.guidance.append(text)
        if self.state.plan is not None:
            self.state.plan = self.state.plan.model_copy(update={"notes": f"{self.state.plan.notes}\nGuidance from the person: {text}".strip()})
        await self.log_decision("redirect", f"guidance: {text}")
        self.write("noted: the next plan and kernel will get it")

    # -- helpers --------------------------------------------------------------------------------

    def need(self, what: str) -> Any:
        value = getattr(self.state, what)
        if value is None:
            self.write({"plan": "no plan yet: run plan", "draft": "no kernel yet: run implement"}[what])
        return value

    def diff(self, source: str) -> str:
        before = self.state.draft.source if self.state.draft else ""
        if not before:
            return source
        lines = difflib.unified_diff(before.splitlines(), source.splitlines(), "previous", "proposed", lineterm="")
        return "\n".join(lines) or "(same as the previous kernel)"

    async def loop(self) -> None:
        commands = {name[3:]: getattr(self, name) for name in dir(self) if name.startswith("do_")}
        while True:
            try:
                line = self.read("maxkernel> ").strip()
            except EOFError:
                line = "quit"
            if not line:
                continue
            word, _, rest = line.partition(" ")
            if word in ("quit", "exit"):
                self.write(f"session {self.session_id} saved; resume with: maxkernel chat {task_argument(self.task)} "
                           f"--resume {self.session_id}")
                return
            if word in BUDGETED and (refused := self.spent()):
                self.write(refused)
            elif word in commands:
                started = time.monotonic()
                try:
                    await commands[word](rest)
                except Exception as exc:  # one step failing must not end the chat or lose the session
                    self.write(f"{word} failed: {type(exc).__name__}: {exc}")
                if word in BUDGETED:
                    self.worked_s += time.monotonic() - started
            else:
                await self.guidance(line)


def step_text(kind: str, message: Any, edited: bool = False) -> str:
    """One step in words, for the history and for what ``undo`` says it took back."""
    if message is None:
        return kind
    if kind == "plan":
        names = [s.name for s in message.strategies]
        return f"plan of {len(names)}: {', '.join(names[:5])}" + (", ..." if len(names) > 5 else "")
    if kind in ("kernel", "fix"):
        how = " edited by hand" if edited else ""
        return f"{kind} {message.plan.current.name} (candidate {message.candidate_id[:12]}){how}"
    if kind == "report":
        report = message.report
        speed = format_speedup(report.speedup, report.interval) if report.speedup is not None else "no timing"
        return f"test of {message.draft.plan.current.name}: {report.status}, {speed}"
    if kind == "profile":
        return f"profile: {message.bound}-bound"
    if kind == "tune":
        speed = format_speedup(message.report.speedup, message.report.interval)
        return f"tune of {message.strategy or 'the kernel'}: {speed}"
    return kind


def accepted_candidate(events: list[Any]) -> str | None:
    """The candidate a chat session's accepted kernel is, replaying its decisions as the chat does: every
    approved step (and an acceptance) is one step on the undo stack, and ``undo`` takes the last one back."""
    stack: list[str | None] = []
    pending: dict[str, Any] | None = None
    for event in events:
        if event.message_type == "HumanPrompt":
            pending = event.payload["subject"]
        elif event.message_type == "HumanDecision":
            decision, text = event.payload["decision"], event.payload["text"]
            if text == "undo":
                if stack:
                    stack.pop()
            elif text.startswith("accepted"):
                words = text.split()
                stack.append(words[4] if len(words) > 4 else None)
            elif decision in ("approve", "edit") and not text.startswith("guidance:") and pending and pending.get("message"):
                stack.append(None)
            pending = None
    return next((c for c in reversed(stack) if c), None)


def history_line(decision: str, text: str, what: str) -> str:
    shown = "limits" if text.startswith(LIMITS) else text  # the limits' JSON is for the log, not for people
    return f"{decision}: {shown}" + (f" — {what}" if what else "")


def task_argument(task: Any) -> str:
    """How to name ``task`` on the command line again: its suite id, or its folder when it is not one."""
    from jaxbench.task import SUITE_DIR

    return task.id if task.path.resolve().parent == SUITE_DIR.resolve() else str(task.path)


def _unrecorded(services: Services, candidate_id: str) -> bool:
    from memory.errors import RecordNotFoundError

    try:
        services.store.get_candidate(candidate_id)
        return False
    except RecordNotFoundError:
        return True


def _message(subject: dict[str, Any]) -> Any:
    return message_from_event(subject["type"], subject["message"])


def plan_text(plan: Plan) -> str:
    lines = [f"{i + 1}. {s.name}: {s.rationale}" + (f" {s.params}" if s.params and "source" not in s.params else "")
             for i, s in enumerate(plan.strategies)]
    return "\n".join(lines + ([f"notes: {plan.notes}"] if plan.notes else []))


def _edited_plan(plan: Plan, text: str) -> Plan:
    """Keep the strategies whose numbered lines the person kept, in the order they left them."""
    kept = []
    for line in text.splitlines():
        head = line.split(".", 1)[0].strip()
        if head.isdigit() and 0 < int(head) <= len(plan.strategies):
            kept.append(plan.strategies[int(head) - 1])
    return plan.model_copy(update={"strategies": kept or plan.strategies, "step": 0})


def report_text(report: JudgeReport) -> str:
    speed = f"{format_speedup(report.speedup, report.interval)} ({report.basis})" if report.speedup is not None else "-"
    return f"status {report.status}, correct {report.correct}, speedup {speed}" + (f"\nreason: {report.reason[:800]}" if report.reason else "")


async def run_chat(task_id: str, config: ActorConfig, *, resume: str | None = None, target: str = "cpu",
                   limits: ChatLimits | None = None, read: Callable[[str], str] = input,
                   write: Callable[[str], None] = print) -> str:
    """Run a chat (or resume one); ``limits`` set on a resume replace the stored ones."""
    limits = limits or ChatLimits()
    services = Services(config.model_copy(update={"remember": False}))
    try:
        task = services.task(task_id)
        if resume:
            info = services.store.get_session(resume)
            if info.task_id and info.task_id != task.id:
                from memory.errors import RecordNotFoundError

                raise RecordNotFoundError(f"session {resume} is a session of {info.task_id}, not of {task.id}")
            chat = Chat(services, info.task_id or task.id, resume, info.target, read, write)
            seen = chat.restore()
            write(f"resumed session {resume}: {seen} events, {len(chat.history)} decisions")
            await chat.set_limits(chat.limits.given(limits))
        else:
            session_id = new_id()
            services.store.create_session(mode="hitl", brain=brain_label(services.config), target=target,
                                          budget=limits.model_dump(), task_id=task.id, id=session_id)
            chat = Chat(services, task.id, session_id, target, read, write)
            write(f"session {session_id} on {task.id} ({brain_label(services.config)} brain); type help")
            await chat.set_limits(limits)
        if chat.limits != ChatLimits():
            write(await asyncio.to_thread(chat.budget_text))
        await chat.loop()
        return chat.session_id
    finally:
        await services.aclose()


def main(argv: list[str] | None = None) -> int:
    import argparse

    from actors.session import config_for_brain

    parser = argparse.ArgumentParser(prog="python -m orchestrators.hitl")
    parser.add_argument("task")
    parser.add_argument("--brain", default="rules")
    parser.add_argument("--transcript", default=None)
    parser.add_argument("--resume", default=None)
    args = parser.parse_args(argv)
    from maxkernel.logging import configure

    configure("warning")
    config = config_for_brain(args.brain, transcript=Path(args.transcript) if args.transcript else None)
    asyncio.run(run_chat(args.task, config, resume=args.resume))
    return 0


if __name__ == "__main__":
    sys.exit(main())
