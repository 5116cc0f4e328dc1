"""Auto: plan → implement → validate (self-debug) → test → tune → profile → plan again, unattended.

One iteration hands the coder one step of the plan; the pipeline of actors takes it to a scored candidate
(or gives the strategy up, or runs out of strategies). Between iterations the orchestrator folds what
happened into feedback, picks the next untried strategy, and asks the planner again when the plan is used
up. It stops when the budget (time, evaluations, tokens) ends, after ``patience`` iterations without a
better kernel, or when the planner has nothing new. Memory seeds the planner (it recalls before planning);
at the end the best correct kernel is remembered with a note on what worked and what failed.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timezone
from typing import Any, Callable, Literal

import structlog
from pydantic import BaseModel, Field

from actors.config import ActorConfig
from actors.services import Services
from jaxbench.report import EvalReport as JudgeReport
from maxkernel.messages import (
    Budget,
    BusMessage,
    CandidateScored,
    OptimizeRequest,
    Plan,
    SessionFinished,
    StrategyRef,
    message_from_event,
    new_id,
)
from orchestrators.bus import Bus, is_evaluation
from orchestrators.feedback import Attempt, attempts, feedback_text

log = structlog.get_logger("orchestrators.auto")

OnEvent = Callable[[str, dict[str, Any]], None]


class AutoBudget(BaseModel):
    """Limits of one Auto run; ``None`` means unlimited. Evaluations are checked between iterations and
    cap the tuner's trials, so an iteration can overshoot by its fix attempts."""

    time_s: float | None = 900.0
    max_evaluations: int | None = 60
    max_tokens: int | None = None
    max_cost_usd: float | None = None
    max_iterations: int = 8
    patience: int = Field(2, description="stop after this many iterations without a better kernel")
    max_fix_attempts: int = 2
    tune_max_trials: int | None = 3
    tune_budget_s: float = 60.0


class Iteration(BaseModel):
    n: int
    step: int
    strategies: list[str]
    status: str
    reason: str = ""
    speedup: float | None = None
    best_speedup: float | None = None
    evaluations: int
    improved: bool
    seconds: float


class AutoResult(BaseModel):
    session_id: str
    task_id: str
    target: str
    brain: str
    status: Literal["scored", "failed", "budget", "error"]
    stop_reason: str
    best_source: str | None = None
    best_report: JudgeReport | None = None
    best_strategy: str = ""
    best_candidate_id: str | None = None
    iterations: list[Iteration] = Field(default_factory=list)
    attempts: list[Attempt] = Field(default_factory=list)
    evaluations: int = 0
    first_correct_at: int | None = Field(None, description="evaluations spent when the first correct kernel came")
    best_at: int | None = Field(None, description="evaluations spent when the best kernel came")
    tokens: int = 0
    recalled: list[str] = Field(default_factory=list)
    remembered_kernel: str | None = None
    remembered_note: str | None = None
    seconds: float = 0.0
    resumed_evaluations: int = Field(0, description="evaluations carried over from an interrupted run of the job")


def brain_label(config: ActorConfig) -> str:
    return config.brain if config.brain == "rules" else f"llm:{config.model}"


def strategy_key(ref: StrategyRef) -> str:
    return ref.name


def evaluation_index(messages: list[Any], report: JudgeReport | None) -> int | None:
    """How many evaluations had been spent when ``report`` came (or, with None, the first passing one)."""
    count = 0
    for message in messages:
        if not is_evaluation(message):
            continue
        count += 1
        got = message.report
        if report is None and got.passed:
            return count
        if report is not None and got.passed and got.kernel_ms == report.kernel_ms and got.speedup == report.speedup:
            return count
    return None


class AutoRun:
    """The state of one Auto run on an open bus; ``run()`` drives it to the end."""

    def __init__(self, bus: Bus, task_id: str, *, target: str, size: str, budget: AutoBudget, session_id: str,
                 on_event: OnEvent | None = None) -> None:
        self.bus, self.services = bus, bus.services
        self.task = self.services.task(task_id)
        self.target, self.size, self.budget, self.session_id = target, size, budget, session_id
        self.emit: OnEvent = on_event or (lambda _k, _d: None)
        self.started = time.monotonic()
        self.history: dict[str, Attempt] = {}
        self.iterations: list[Iteration] = []
        self.best: CandidateScored | None = None
        self.best_kernel: CandidateScored | None = None  # the best that is more than the reference again
        self.best_at: int | None = None
        self.first_correct_at: int | None = None
        self.catalog: Plan | None = None
        self.recalled: list[str] = []

    # -- budget ---------------------------------------------------------------------------------

    @property
    def evaluations(self) -> int:
        return self.bus.log(self.session_id).evaluations

    def time_left(self) -> float | None:
        if self.budget.time_s is None:
            return None
        return self.budget.time_s - (time.monotonic() - self.started)

    def message_budget(self) -> Budget:
        trials = self.budget.tune_max_trials
        if self.budget.max_evaluations is not None:
            left = self.budget.max_evaluations - self.evaluations - 1  # one goes to the draft itself
            trials = max(1, min(trials if trials is not None else left, left))
        return Budget(max_tokens=self.budget.max_tokens, max_cost_usd=self.budget.max_cost_usd,
                      max_fix_attempts=self.budget.max_fix_attempts, tune_budget_s=self.budget.tune_budget_s,
                      tune_max_trials=trials)

    def stop_reason(self) -> str | None:
        left = self.time_left()
        if left is not None and left <= 0:
            return f"time budget of {self.budget.time_s} s spent"
        if self.budget.max_evaluations is not None and self.evaluations >= self.budget.max_evaluations:
            return f"evaluation budget spent ({self.evaluations} of {self.budget.max_evaluations})"
        if len(self.iterations) >= self.budget.max_iterations:
            return f"{self.budget.max_iterations} iterations done"
        stale = 0
        for it in reversed(self.iterations):
            if it.improved:
                break
            stale += 1
        if self.best is not None and stale >= self.budget.patience:
            return f"no improvement in {stale} iterations"
        return None

    # -- one iteration --------------------------------------------------------------------------

    def next_step(self) -> int | None:
        if self.catalog is None:
            return None
        for i, ref in enumerate(self.catalog.strategies):
            if strategy_key(ref) not in self.history:
                return i
        return None

    async def replan(self) -> str | None:
        """Ask the planner (memory first); returns why not when it has nothing new."""
        tried = list(self.history.values())
        request = OptimizeRequest(session_id=self.session_id, task_id=self.task.id, target=self.target,
                                  size=self.size, brain=brain_label(self.services.config), budget=self.message_budget(),
                                  sender="auto", feedback=feedback_text(tried),
                                  exclude=sorted({attempt.strategy for attempt in tried}))
        outcome = await self.bus.plan(request, self.time_left())
        if isinstance(outcome, SessionFinished):
            return outcome.reason or f"planner ended with {outcome.status}"
        self.catalog = outcome
        self.recalled = sorted(set(self.recalled) | set(outcome.recalled))
        self.emit("plan", {"strategies": [s.name for s in outcome.strategies], "recalled": outcome.recalled})
        if self.next_step() is None:
            return "the planner proposed nothing that was not tried already"
        return None

    def consider(self, candidate: CandidateScored) -> bool:
        """Keep ``candidate`` if it is the best so far (and the best real kernel); True when it improved."""
        speedup = candidate.report.speedup if candidate.report.passed else None
        if speedup is None:
            return False
        if candidate.report.label != "reference-equivalent" and (
                self.best_kernel is None or speedup > (self.best_kernel.report.speedup or 0.0)):
            self.best_kernel = candidate
        if self.best is not None and speedup <= (self.best.report.speedup or 0.0):
            return False
        self.best = candidate
        self.best_at = evaluation_index(self.bus.log(self.session_id).messages, candidate.report)
        return True

    def restore(self, messages: list[BusMessage]) -> int:
        """Carry an interrupted run's work into this one (a daemon job run again after its daemon died).

        Its evaluations count against the budget, the strategies it evaluated are not worked on
        again, its best kernel is the one to beat, and its plan is reused. Returns how many
        evaluations were carried.
        """
        record = self.bus.log(self.session_id)
        record.messages[:0] = messages
        for attempt in attempts(messages):
            if attempt.status != "untried":  # a draft cut off before its evaluation is worked on again
                self.history[attempt.strategy] = attempt
        plans = [m for m in messages if isinstance(m, Plan)]
        if plans:
            self.catalog = plans[-1].model_copy(update={"session_id": self.session_id, "step": 0})
        for message in messages:
            if isinstance(message, CandidateScored):
                self.consider(message)
        self.first_correct_at = evaluation_index(record.messages, None)
        return sum(1 for m in messages if is_evaluation(m))

    async def iterate(self, step: int) -> SessionFinished:
        assert self.catalog is not None
        notes = "\n\n".join(x for x in (self.catalog.notes, feedback_text(list(self.history.values()))) if x)
        plan = self.catalog.model_copy(update={
            "step": step, "notes": notes, "budget": self.message_budget(), "message_id": new_id(),
            "sent_at": datetime.now(timezone.utc), "candidate_id": None, "parent_id": None})
        record = self.bus.log(self.session_id)
        mark, spent_before, began = len(record.messages), self.evaluations, time.monotonic()
        self.emit("iteration", {"n": len(self.iterations), "strategy": plan.current.name})
        finished = await self.bus.run_plan(plan, self.time_left())
        seen = attempts(record.since(mark))
        for attempt in seen:
            self.history[attempt.strategy] = attempt
        candidate = finished.best if finished.status == "scored" else None
        speedup = candidate.report.speedup if candidate is not None and candidate.report.passed else None
        improved = candidate is not None and self.consider(candidate)
        if self.first_correct_at is None:
            self.first_correct_at = evaluation_index(record.messages, None)
        self.iterations.append(Iteration(
            n=len(self.iterations), step=step, strategies=[a.strategy for a in seen] or [plan.current.name],
            status=finished.status, reason=finished.reason, speedup=speedup,
            best_speedup=self.best.report.speedup if self.best else None,
            evaluations=self.evaluations - spent_before, improved=improved, seconds=round(time.monotonic() - began, 3)))
        self.emit("iterated", self.iterations[-1].model_dump())
        return finished

    async def run(self) -> tuple[str, str]:
        """Iterate until a stop condition; returns (status, stop reason)."""
        status = "failed"
        while True:
            reason = self.stop_reason()
            if reason:
                break
            step = self.next_step()
            if step is None:
                reason = await self.replan()
                if reason:
                    break
                step = self.next_step()
                assert step is not None
            finished = await self.iterate(step)
            if finished.status in ("budget", "error"):
                status, reason = finished.status, finished.reason
                break
        if self.best is not None and status not in ("budget", "error"):
            status = "scored"
        return status, reason or ""


def messages_of(store: Any, session_ids: list[str]) -> list[BusMessage]:
    """The persisted bus messages of ``session_ids``, in order (events that do not parse as one are left out)."""
    out: list[BusMessage] = []
    for session_id in session_ids:
        for event in store.events(session_id=session_id):
            try:
                message = message_from_event(event.message_type, event.payload)
            except ValueError:
                continue
            if isinstance(message, BusMessage):
                out.append(message)
    return out


def summary_note(run: AutoRun) -> tuple[str, str]:
    """The note remembered at the end: what worked and what failed on this task (and its outcome)."""
    worked = [a.line() for a in run.history.values() if a.status == "ok"]
    failed = [a.line() for a in run.history.values() if a.status != "ok"]
    head = f"Auto on {run.task.id} ({run.target})"
    if run.best is not None:
        head += f": best {run.best.strategy} at {run.best.report.speedup}x ({run.best.report.basis})"
    text = head + ". Worked: " + ("; ".join(worked) or "nothing") + ". Failed: " + ("; ".join(failed) or "nothing") + "."
    outcome = "worked" if run.best is not None and (run.best.report.speedup or 0) > 1 else "failed" if run.best is None else "info"
    return text[:2000], outcome


def remember(run: AutoRun) -> tuple[str | None, str | None]:
    """Store the best correct kernel (not one that is just the reference again) and the run's note."""
    memory = run.services.memory
    kernel_id = None
    best = run.best_kernel
    if best is not None:
        record = memory.remember_kernel(best.report, best.source, task=run.task, strategy=best.strategy,
                                        produced_by=best.produced_by, session_id=run.session_id,
                                        candidate_id=best.candidate_id, parent_id=best.parent_id)
        kernel_id = record.id
    note_id = None
    if run.history:
        text, outcome = summary_note(run)
        note_id = memory.remember_note(text, task=run.task, outcome=outcome, target=run.target,  # type: ignore[arg-type]
                                       session_id=run.session_id).id
    return kernel_id, note_id


async def run_auto(task_id: str, config: ActorConfig | None = None, *, target: str = "cpu", size: str = "cpu",
                   budget: AutoBudget | None = None, services: Services | None = None, session_id: str | None = None,
                   mode: str = "auto", on_event: OnEvent | None = None, remember_best: bool = True,
                   prior: list[BusMessage] | None = None) -> AutoResult:
    """One Auto run. With ``services`` given (a daemon's), its evaluator, store and memory are shared; give
    it a config with ``remember=False`` so that only the run's best kernel and note are remembered.
    ``prior``: the messages of an interrupted run of the same job, whose work this run carries on."""
    config = config or (services.config if services else ActorConfig())
    budget = budget or AutoBudget()
    own = services is None
    services = services or Services(config.model_copy(update={"remember": False}))
    try:
        return await _run(services, task_id, target, size, budget, session_id or new_id(), mode, on_event,
                          remember_best, prior or [])
    finally:
        if own:
            await services.aclose()


async def _run(services: Services, task_id: str, target: str, size: str, budget: AutoBudget, session_id: str,
               mode: str, on_event: OnEvent | None, remember_best: bool, prior: list[BusMessage]) -> AutoResult:
    task = services.task(task_id)
    brain = brain_label(services.config)
    await asyncio.to_thread(services.store.create_session, mode=mode, brain=brain, target=target,
                            budget=budget.model_dump(), task_id=task.id, id=session_id)
    bus = Bus(services)
    status, reason, interrupted = "error", "", True
    try:
        await bus.__aenter__()
        run = AutoRun(bus, task.id, target=target, size=size, budget=budget, session_id=session_id, on_event=on_event)
        carried = run.restore(prior) if prior else 0
        if prior:
            run.emit("resumed", {"evaluations": carried, "tried": sorted(run.history)})
        try:
            status, reason = await run.run()
            interrupted = False
        except asyncio.TimeoutError:
            status, reason = ("scored" if run.best else "budget"), f"time budget of {budget.time_s} s spent"
    finally:
        # Runs on cancellation too (a daemon job cancelled or shut down): the session says how it ended.
        await bus.close(idle=not interrupted)
        await asyncio.to_thread(services.store.set_session_status, session_id, status)
    kernel_id, note_id = (await asyncio.to_thread(remember, run)) if remember_best else (None, None)
    ledger = services.ledger(session_id, Budget())
    best = run.best
    result = AutoResult(
        session_id=session_id, task_id=task.id, target=target, brain=brain, status=status,  # type: ignore[arg-type]
        stop_reason=reason, best_source=best.source if best else None, best_report=best.report if best else None,
        best_strategy=best.strategy if best else "", best_candidate_id=best.candidate_id if best else None,
        iterations=run.iterations, attempts=list(run.history.values()), evaluations=run.evaluations,
        first_correct_at=run.first_correct_at, best_at=run.best_at, tokens=ledger.tokens, recalled=run.recalled,
        remembered_kernel=kernel_id, remembered_note=note_id, seconds=round(time.monotonic() - run.started, 3),
        resumed_evaluations=carried)
    log.info("auto.finished", session=session_id, task=task.id, status=status, reason=reason,
             evaluations=result.evaluations, best=result.best_report.speedup if result.best_report else None)
    return result


def auto(task_id: str, config: ActorConfig | None = None, **kwargs: Any) -> AutoResult:
    """Blocking form of ``run_auto``."""
    return asyncio.run(run_auto(task_id, config, **kwargs))
