"""Auto: plan → implement → validate (self-debug) → test → tune → profile → plan again, unattended.

This is the one engine: ``maxkernel optimize`` with any brain, daemon jobs and the Python API run it.
First the reference itself is judged as a candidate: that reading is the bar a winner must clear. Then one
iteration hands the coder one step of the plan, and the pipeline of actors takes it to a scored candidate
(or gives the strategy up); each strategy gets its share of the time and evaluations left, which also
bounds its tuning. Between iterations the orchestrator folds what happened into feedback, picks the next
untried strategy, and asks the planner again when the plan is used up. It stops when the budget (time,
evaluations, tokens) ends or the planner has nothing new. Then the top candidates are measured again and
the best confirmed one above the bar wins; when none holds up, the reference is returned and said so.
The rules behind each of these steps live in ``actors.policy``. Memory seeds the planner (it recalls
before planning); at the end the winner is remembered with a note on what worked and what failed.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timezone
from typing import Any, Callable, Literal

import structlog
from pydantic import BaseModel, Field

from actors import policy
from actors.config import ActorConfig
from actors.services import Services
from orchestrators.interrupt import INTERRUPTED
from jaxbench.report import EvalReport as JudgeReport, format_speedup
from maxkernel.messages import (
    Budget,
    BusMessage,
    CandidateScored,
    EvalReport,
    FixRequest,
    KernelDraft,
    OptimizeRequest,
    Plan,
    SessionFinished,
    StrategyRef,
    TuneReport,
    message_from_event,
    new_id,
)
from orchestrators.bus import Bus, is_evaluation
from orchestrators.feedback import Attempt, attempts, feedback_text
from orchestrators.trials import TrialRow, trial_row, trial_rows

log = structlog.get_logger("orchestrators.auto")

OnEvent = Callable[[str, dict[str, Any]], None]
REFERENCE = "reference"
UNCAPPED_TUNE_S = 3600.0
OVERRUN_S = 180.0  # an iteration past the time budget is let finish the evaluation it has in flight


def reference_ref(target: str) -> StrategyRef:
    """The strategy the reference is judged under when it is run as a candidate (the baseline)."""
    return StrategyRef(name=REFERENCE, kind="reference", target=target,
                       rationale="the reference itself, judged as a candidate: the bar")


class AutoBudget(BaseModel):
    """Limits of one Auto run; ``None`` means unlimited. Evaluations are checked between iterations and
    cap each strategy's tuning trials, so an iteration can overshoot by its fix attempts; the baseline
    and confirmation runs count as evaluations too."""

    # every limit is positive: a negative or zero one would run (and be stored, and queued) as if it meant something
    time_s: float | None = Field(900.0, gt=0)
    max_evaluations: int | None = Field(60, ge=1)
    max_tokens: int | None = Field(None, ge=1)
    max_cost_usd: float | None = Field(None, gt=0)
    max_iterations: int | None = Field(None, ge=1)
    patience: int | None = Field(None, ge=1, description="stop after this many iterations without a better kernel "
                                                         "(None: only the budget and the planner end a run)")
    max_fix_attempts: int = Field(2, ge=0)
    tune_max_trials: int | None = Field(None, ge=1,
                                        description="a cap on each strategy's tuning trials on top of its share")
    tune_budget_s: float | None = Field(None, gt=0,
                                        description="a cap on each strategy's tuning seconds on top of its share")
    baseline: bool = Field(True, description="judge the reference as a candidate first: the bar a winner must clear")
    confirm: bool = Field(True, description="measure the top candidates again before naming a winner")
    seed: int = 0


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
    """What one session gave, the same for every brain and every way it was started."""

    session_id: str
    task_id: str
    target: str
    brain: str
    status: Literal["scored", "failed", "budget", "error"]
    stop_reason: str
    best_source: str | None = None
    best_report: JudgeReport | None = None
    best_strategy: str = ""
    best_params: dict[str, Any] = Field(default_factory=dict)
    best_candidate_id: str | None = None
    beat_reference: bool = Field(False, description="a candidate's confirmed speedup cleared the bar")
    speedup: float | None = Field(None, description="the returned kernel's first reading")
    confirmed_speedup: float | None = Field(None, description="the winner's speedup after re-measurement")
    speedup_ci: tuple[float, float] | None = Field(None, description="the returned kernel's interval (the confirmed "
                                                                     "run's for a winner)")
    claim: str = Field("at par", description="faster | at par | slower: what the interval allows one to say")
    verdict: str = Field("", description="the claim in words, with the speedup and its interval")
    confirmation: str = Field("", description="how the confirmed speedup was reached")
    baseline_speedup: float | None = Field(None, description="the reference itself judged as a candidate")
    baseline_speedup_ci: tuple[float, float] | None = Field(None, description="that reading's interval")
    bar: float = Field(1.0, description="the upper end of the reference's own reading as a candidate (at least 1.0); a "
                       "winner's speedup over that reading must clear 1.0 (actors.policy.cleared)")
    note: str = ""
    iterations: list[Iteration] = Field(default_factory=list)
    attempts: list[Attempt] = Field(default_factory=list)
    trials: list[TrialRow] = Field(default_factory=list)
    evaluations: int = 0
    first_correct_at: int | None = Field(None, description="evaluations spent when the first correct kernel came")
    best_at: int | None = Field(None, description="evaluations spent when the returned kernel was first judged")
    tokens: int = 0
    cost_usd: float = 0.0
    recalled: list[str] = Field(default_factory=list)
    remembered_kernel: str | None = None
    remembered_note: str | None = None
    seconds: float = 0.0
    resumed_evaluations: int = Field(0, description="evaluations carried over from an interrupted run of the job")
    resumed_seconds: float = Field(0.0, description="seconds of the time budget the interrupted runs had spent")


def brain_label(config: ActorConfig) -> str:
    return config.brain if config.brain == "rules" else f"llm:{config.model}"


def strategy_key(ref: StrategyRef) -> str:
    return ref.name


def _counts_as_kernel(message: BusMessage) -> bool:
    """A passing evaluation of a real candidate: not the baseline, a confirmation run or the reference again."""
    assert isinstance(message, (EvalReport, FixRequest))
    return (message.draft.produced_by not in (policy.BASELINE, policy.CONFIRM)
            and message.report.label != "reference-equivalent")


def evaluation_index(messages: list[Any], report: JudgeReport | None) -> int | None:
    """How many evaluations had been spent when ``report`` came (or, with None, the first correct kernel)."""
    count = 0
    for message in messages:
        if not is_evaluation(message):
            continue
        count += 1
        got = message.report
        if report is None and got.passed and _counts_as_kernel(message):
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
        self.sessions = [session_id]  # with the sessions of an interrupted run it carries on (a daemon job's)
        self.emit: OnEvent = on_event or (lambda _k, _d: None)
        self.started = time.monotonic()
        self.carried_s = 0.0  # of the time budget, what an interrupted run of the same job had spent
        self.history: dict[str, Attempt] = {}
        self.iterations: list[Iteration] = []
        self.scored: list[CandidateScored] = []
        self.best: CandidateScored | None = None
        self.best_at: int | None = None
        self.first_correct_at: int | None = None
        self.catalog: Plan | None = None
        self.recalled: list[str] = []
        self.baseline_runs: list[JudgeReport] = []
        self.bar = 1.0
        self.winner: CandidateScored | None = None
        self.confirmed_speedup: float | None = None
        self.confirmation = ""
        self.note = ""
        self.reference_misses = ""  # the reference fails its own tolerance on the target: why, said once
        self.reference_unjudged = ""  # the judge could not run or price the reference on the target: why

    # -- budget ---------------------------------------------------------------------------------

    @property
    def evaluations(self) -> int:
        return self.bus.log(self.session_id).evaluations

    @property
    def baseline(self) -> JudgeReport | None:
        return policy.baseline_of(self.baseline_runs)

    def time_left(self) -> float | None:
        if self.budget.time_s is None:
            return None
        return self.budget.time_s - self.carried_s - (time.monotonic() - self.started)

    def seconds_per_evaluation(self) -> float | None:
        """What one evaluation has cost this run so far, all overheads in: the estimate of the next one's."""
        done = self.evaluations
        return (time.monotonic() - self.started) / done if done else None

    def grace(self) -> float | None:
        """How long a step already started may take: the time left, plus the overrun a step in flight is let
        have (an evaluation cannot be cut short)."""
        left = self.time_left()
        return None if left is None else max(0.0, left) + OVERRUN_S

    def evaluations_left(self) -> int | None:
        if self.budget.max_evaluations is None:
            return None
        return max(0, self.budget.max_evaluations - self.evaluations)

    def strategies_left(self) -> int:
        """Steps of the plan not yet worked on (the one about to start included)."""
        if self.catalog is None:
            return 1
        return max(1, sum(1 for ref in self.catalog.strategies if strategy_key(ref) not in self.history))

    def message_budget(self) -> Budget:
        """The budget the next strategy works under: its share of what is left (``actors.policy``)."""
        n = self.strategies_left()
        left = self.time_left()
        # the strategies share what is left after the re-measurements that will name a winner
        time_share = policy.share(None if left is None else left - policy.reserve_s(self.seconds_per_evaluation()), n)
        trials = policy.trial_cap(self.evaluations_left(), n)
        if self.budget.tune_max_trials is not None:
            trials = self.budget.tune_max_trials if trials is None else min(trials, self.budget.tune_max_trials)
        tune_s = UNCAPPED_TUNE_S if time_share is None else time_share
        if self.budget.tune_budget_s is not None:
            tune_s = min(tune_s, self.budget.tune_budget_s)
        return Budget(max_tokens=self.budget.max_tokens, max_cost_usd=self.budget.max_cost_usd,
                      max_fix_attempts=self.budget.max_fix_attempts, tune_budget_s=tune_s, tune_max_trials=trials,
                      share_ends_at=None if time_share is None else time.time() + time_share, seed=self.budget.seed)

    def stop_reason(self) -> str | None:
        if not self.iterations and not any(name != REFERENCE for name in self.history):
            return None  # the first strategy is always worked on, whatever the baseline cost
        left = self.time_left()
        if left is not None and left <= 0:
            return f"time budget of {self.budget.time_s} s spent"
        per = self.seconds_per_evaluation()
        if not policy.can_start(left, per):
            assert left is not None and per is not None
            return (f"time budget of {self.budget.time_s} s nearly spent: {left:.0f} s left, less than one more "
                    f"evaluation (~{per:.0f} s) and the re-measurements that name a winner")
        if self.budget.max_evaluations is not None and self.evaluations >= self.budget.max_evaluations:
            return f"evaluation budget spent ({self.evaluations} of {self.budget.max_evaluations})"
        if self.budget.max_iterations is not None and len(self.iterations) >= self.budget.max_iterations:
            return f"{self.budget.max_iterations} iterations done"
        if self.budget.patience is not None and self.best is not None:
            stale = 0
            for it in reversed(self.iterations):
                if it.improved:
                    break
                stale += 1
            if stale >= self.budget.patience:
                return f"no improvement in {stale} iterations"
        return None

    # -- judging outside the pipeline: the baseline and confirmation runs -----------------------

    async def judge(self, source: str, produced_by: str, ref: StrategyRef, candidate_id: str | None = None) -> JudgeReport:
        reply = await self.bus.judge(self.session_id, self.task.id, source, ref, produced_by, target=self.target,
                                     size=self.size, candidate_id=candidate_id)
        return reply.report

    async def measure_baseline(self) -> None:
        """The reference run as a candidate, re-measured when its reading is suspect; it sets the bar."""
        from maxkernel.rules.strategy import reference_source

        ref, source = reference_ref(self.target), reference_source(self.task)
        self.baseline_runs = []
        while policy.baseline_more(self.baseline_runs):
            self.baseline_runs.append(await self.judge(source, policy.BASELINE, ref))
        self._set_bar()
        baseline = self.baseline
        assert baseline is not None
        self.emit("baseline", {"speedup": baseline.speedup, "status": baseline.status, "bar": self.bar,
                               "runs": len(self.baseline_runs)})
        await self.explain_reference(baseline)

    async def explain_reference(self, baseline: JudgeReport) -> None:
        """A reference that misses its own tolerance under the target's numerics is a valid task, not a failed
        session: say so once (its error, the tolerance, which precision passes) and go on. Candidates are still
        judged against the exact result at the task's tolerance, the reference's modelled time is still the
        baseline, and if nothing beats it the reference is returned with this reason. A reference the judge
        could not run or price on the target (its lowering stage ran out of time, say) is still the task's own
        computation: it is returned with that reason unless a candidate beats it."""
        if not baseline.passed and baseline.status != "incorrect":
            self.reference_unjudged = (f"the reference itself was not judged on {self.target} "
                                       f"({baseline.status}: {baseline.reason or 'no reason given'})")
            self.emit("reference_unjudged", {"text": self.reference_unjudged})
            return
        if baseline.status != "incorrect" or not self.target.startswith("tpu"):
            return
        from maxkernel.analysis.precision import precision_need

        need = await asyncio.to_thread(precision_need, self.task)
        if not need.own_misses:
            return
        self.reference_misses = need.describe()
        log.info("auto.reference_misses_tolerance", session=self.session_id, task=self.task.id,
                 ratios=need.ratios, passes=need.passes)
        self.emit("reference_numerics", {"text": self.reference_misses, "passes": need.passes,
                                         "ratios": {str(k): v for k, v in need.ratios.items()}})

    def _set_bar(self) -> None:
        self.bar, _ = policy.baseline_bar(self.baseline_runs)
        baseline = self.baseline
        assert baseline is not None
        self.history[REFERENCE] = Attempt(
            strategy=REFERENCE, step=-1, evaluations=len(self.baseline_runs),
            status="ok" if baseline.passed else baseline.status, speedup=baseline.speedup,
            speedup_ci=baseline.interval,
            reason="" if baseline.passed else baseline.reason)

    async def conclude(self, reason: str = "") -> None:
        """Re-measure the top candidates; the best whose confirmed lower end clears the bar wins. ``reason``:
        why the run stopped, said when nothing was tried."""
        kernels = [c for c in self.scored if c.report.passed and c.report.label != "reference-equivalent"]
        baseline = self.baseline
        for candidate in policy.to_confirm(kernels, lambda c: self.cleared(c.report),
                                           centre_of=lambda c: policy.centre(c.report, baseline)):
            first = self.cleared(candidate.report)
            runs, reports = [first], [candidate.report]
            if self.budget.confirm and policy.needs_confirmation(candidate.report):
                ref = self._ref(candidate.strategy)
                while policy.confirm_more(runs):
                    again = await self.judge(candidate.source, policy.CONFIRM, ref, candidate.candidate_id)
                    runs.append(self.cleared(again))
                    reports.append(again)
                    self.emit("confirm", {"strategy": candidate.strategy, "first": first, "again": runs[-1]})
                    if not again.passed:
                        break
            value = policy.confirmed(runs)
            log.info("auto.confirm", session=self.session_id, strategy=candidate.strategy, runs=runs, bar=self.bar)
            if value > 1.0:
                chosen = reports[policy.claimed_run(runs, value)]  # one figure: the re-measurement's reading
                self.winner = candidate.model_copy(update={"report": chosen})
                self.confirmed_speedup = chosen.speedup
                self.confirmation = policy.confirmation_label(runs)
                if not policy.needs_confirmation(candidate.report):
                    self.confirmation = f"{candidate.report.basis}, deterministic"
                base = baseline.speedup if baseline is not None else None
                span = baseline.interval if baseline is not None else None
                written = {k: v for k, v in self.params_of(candidate).items() if k not in ("source", "rewrites")}
                at = f" at {written}" if written else ""  # the chosen kernel's own parameters, the tuner's best
                self.note = (f"{candidate.strategy}{at} is {policy.describe(chosen.speedup, chosen.interval, value)} "
                             f"({self.confirmation})" + (f"; the reference itself run as a candidate scored "
                                                         f"{format_speedup(base, span)}" if base else ""))
                return
        best = max(kernels, key=lambda c: self.cleared(c.report), default=None)
        if not kernels:
            self.note = self.nothing_passed(reason)
            return
        self.note = "nothing beat the reference: the best candidate is the reference itself"
        if best is not None:
            self.note += (f" (best tried: {best.strategy}, "
                          f"{policy.describe(best.report.speedup, best.report.interval, self.cleared(best.report))}")
            if baseline is not None and baseline.speedup:
                self.note += (f"; the reference itself run as a candidate scored "
                              f"{format_speedup(baseline.speedup, baseline.interval)}")
            self.note += ")"

    def cleared(self, report: JudgeReport) -> float:
        """What must clear 1.0 for ``report`` to win: its lower end, and its speedup over the reference's own
        reading as a candidate (``actors.policy.cleared``)."""
        return policy.cleared(report, self.baseline)

    def tried_nothing(self) -> bool:
        """No strategy was worked on: only the reference (if that) was judged."""
        return set(self.history) <= {REFERENCE}

    def nothing_passed(self, reason: str) -> str:
        """The note of a run without a single passing candidate: whether anything was tried, and why it ended."""
        text = ("nothing beat the reference: tried nothing besides the reference itself" if self.tried_nothing()
                else "nothing beat the reference: no candidate passed; the best candidate is the reference itself")
        return text + (f" ({reason})" if reason else "")

    def params_of(self, candidate: CandidateScored) -> dict[str, Any]:
        """The parameters ``candidate`` was written at: the tuner's best, else those its draft's plan carried
        (a fix may have changed them), else its strategy's in the plan."""
        messages = self.bus.log(self.session_id).messages
        for message in messages:
            if isinstance(message, TuneReport) and message.candidate_id == candidate.candidate_id:
                return dict(message.best_params)
        for message in messages:
            if (isinstance(message, KernelDraft) and message.candidate_id == candidate.candidate_id
                    and message.plan.current.name == candidate.strategy):
                return dict(message.plan.current.params)
        return dict(self._ref(candidate.strategy).params)

    def _ref(self, strategy: str) -> StrategyRef:
        if self.catalog is not None:
            for ref in self.catalog.strategies:
                if ref.name == strategy:
                    return ref
        return StrategyRef(name=strategy, target=self.target)

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
        outcome = await self.bus.plan(request, self.grace())
        if isinstance(outcome, SessionFinished):
            return outcome.reason or f"planner ended with {outcome.status}"
        ordered = policy.work_order(outcome.strategies, lambda ref: policy.order_kind(ref.kind, ref.name, ref.work_ratio),
                                    self.target, lambda ref: ref.prior)
        self.catalog = outcome.model_copy(update={"strategies": ordered})
        self.recalled = sorted(set(self.recalled) | set(outcome.recalled))
        self.emit("plan", {"strategies": [s.name for s in ordered], "recalled": outcome.recalled})
        if self.next_step() is None:
            return "the planner proposed nothing that was not tried already"
        return None

    def consider(self, candidate: CandidateScored) -> bool:
        """Keep ``candidate`` for confirmation; True when its reading is the best so far."""
        speedup = candidate.report.speedup if candidate.report.passed else None
        if speedup is None:
            return False
        self.scored.append(candidate)
        if self.best is not None and speedup <= (self.best.report.speedup or 0.0):
            return False
        self.best = candidate
        self.best_at = evaluation_index(self.bus.log(self.session_id).messages, candidate.report)
        return True

    def restore(self, messages: list[BusMessage]) -> int:
        """Carry an interrupted run's work into this one (a daemon job run again after its daemon died).

        Its evaluations and the time it ran count against the budget, the strategies it evaluated are
        not worked on again, its baseline stands, its candidates are confirmed with this run's, and its
        plan is reused: the job does what it would have done without the interruption, not a second
        budget's worth. Returns how many evaluations were carried.
        """
        record = self.bus.log(self.session_id)
        record.messages[:0] = messages
        self.carried_s = time_spent(messages)
        for attempt in attempts(messages):
            if attempt.status != "untried":  # a draft cut off before its evaluation is worked on again
                self.history[attempt.strategy] = attempt
        plans = [m for m in messages if isinstance(m, Plan)]
        if plans:
            self.catalog = plans[-1].model_copy(update={"session_id": self.session_id, "step": 0})
        self.baseline_runs = [m.report for m in messages
                              if isinstance(m, EvalReport) and m.draft.produced_by == policy.BASELINE][:3]
        if self.baseline_runs:
            self._set_bar()
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
        self.emit("iteration", {"n": len(self.iterations), "strategy": plan.current.name,
                                "budget_s": round(plan.budget.tune_budget_s, 1)})
        finished = await self.bus.run_plan(plan, self.grace())
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
        """Baseline, iterate until a stop condition, confirm; returns (status, stop reason)."""
        status = "failed"
        if self.budget.baseline and not self.baseline_runs:
            await self.measure_baseline()
        elif self.baseline is not None and not (self.reference_misses or self.reference_unjudged):
            await self.explain_reference(self.baseline)  # carried over from an interrupted run: said again here
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
        if status != "error":
            await self.conclude(reason or "")
        if self.returned() is not None and status not in ("budget", "error"):
            status = "scored"
        return status, reason or ""

    def returned(self) -> tuple[str, JudgeReport, str, dict[str, Any]] | None:
        """(source, report, strategy, params) of what the run hands back: the winner, else the reference."""
        if self.winner is not None:
            return self.winner.source, self.winner.report, self.winner.strategy, self.params_of(self.winner)
        if not self.budget.baseline and self.best is not None:  # no bar was measured: the best reading stands
            return self.best.source, self.best.report, self.best.strategy, self.params_of(self.best)
        baseline = self.baseline
        if baseline is not None and (baseline.passed or self.reference_misses or self.reference_unjudged):
            from maxkernel.rules.strategy import reference_source

            return reference_source(self.task), baseline, REFERENCE, {}
        return None


def time_spent(messages: list[BusMessage]) -> float:
    """Seconds the sessions of ``messages`` ran: per session, from its first message to its last recorded one.

    What an interrupted session did after its last recorded message (an evaluation cut off) and the wait
    until the job was taken over are not counted: that time bought nothing the job can carry on from."""
    spans: dict[str, tuple[datetime, datetime]] = {}
    for message in messages:
        first, last = spans.get(message.session_id, (message.sent_at, message.sent_at))
        spans[message.session_id] = (min(first, message.sent_at), max(last, message.sent_at))
    return sum((last - first).total_seconds() for first, last in spans.values())


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
    """The note remembered at the end: what worked and what failed on this task (and its outcome). Its
    figures are read from the event log of the run's sessions by the functions the report uses, so a job's
    note and its report agree about evaluations and speedups."""
    from orchestrators.report_data import contributions, sessions_nodes

    nodes = sessions_nodes(run.services.store, run.sessions)
    rows = contributions(nodes)
    worked = [r.line() for r in rows if r.best is not None]
    failed = [r.line() for r in rows if r.best is None]
    head = f"Auto on {run.task.id} ({run.target}), {len(nodes)} evaluations"
    head += f": {run.note}" if run.note else ""
    text = head + ". Worked: " + ("; ".join(worked) or "nothing") + ". Failed: " + ("; ".join(failed) or "nothing") + "."
    outcome = "worked" if run.winner is not None else "failed" if not run.scored else "info"
    return text[:2000], outcome


def remember(run: AutoRun) -> tuple[str | None, str | None]:
    """Store the winner with its confirmed report (else the best correct kernel that is not the reference
    again: verified, though not faster) and the run's note."""
    baseline = run.baseline
    if baseline is not None and not baseline.passed:
        return None, None  # the reference itself did not run: the session learned nothing of any strategy
    memory = run.services.memory
    kernel_id = None
    kernels = [c for c in run.scored if c.report.label != "reference-equivalent"]
    best = run.winner or max(kernels, key=lambda c: policy.lower(c.report), default=None)
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
    """One Auto run on a suite id or a task folder. With ``services`` given (a daemon's), its evaluator,
    store and memory are shared; give it a config with ``remember=False`` so that only the run's winner and
    note are remembered. ``prior``: the messages of an interrupted run of the same job, whose work this run
    carries on. ``on_event`` sees ``baseline``, ``plan``, ``iteration``, ``trial``, ``iterated`` and
    ``confirm`` events (a progress display)."""
    from maxkernel.targets.names import parse_target

    parse_target(target)  # a bad target fails here (one line), before anything starts
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
    emit: OnEvent = on_event or (lambda _k, _d: None)

    def on_message(message: BusMessage) -> None:
        row = trial_row(message) if message.session_id == session_id else None
        if row is not None:
            emit("trial", row.model_dump())

    bus = Bus(services, on_message=on_message)
    status, reason, interrupted = "error", "", True
    try:
        await bus.__aenter__()
        run = AutoRun(bus, task.id, target=target, size=size, budget=budget, session_id=session_id, on_event=emit)
        carried = run.restore(prior) if prior else 0
        run.sessions = list(dict.fromkeys(m.session_id for m in prior if m.session_id != session_id)) + [session_id]
        if prior:
            run.emit("resumed", {"evaluations": carried, "tried": sorted(run.history)})
        try:
            status, reason = await run.run()
            interrupted = False
        except asyncio.CancelledError:  # Ctrl-C, SIGTERM, a daemon's cancel: cut short, not failed
            status, reason = INTERRUPTED, "interrupted"
            raise
        except asyncio.TimeoutError:
            status, reason = ("scored" if run.best else "budget"), f"time budget of {budget.time_s} s spent"
            if run.best is None:
                run.note = run.nothing_passed(reason)
        for why in (run.reference_misses, run.reference_unjudged):
            if run.winner is None and why:
                run.note = (run.note + "; " if run.note else "") + f"the reference is returned: {why}"
    finally:
        # Runs on cancellation too (a daemon job cancelled or shut down): the session says how it ended.
        await bus.close(idle=not interrupted)
        await asyncio.to_thread(services.store.set_session_status, session_id, status)
    kernel_id, note_id = (await asyncio.to_thread(remember, run)) if remember_best else (None, None)
    ledger = services.ledger(session_id, Budget())
    returned = run.returned()
    source, report, strategy, params = returned if returned is not None else (None, None, "", {})
    messages = bus.log(session_id).messages
    baseline = run.baseline
    result = AutoResult(
        session_id=session_id, task_id=task.id, target=target, brain=brain, status=status,  # type: ignore[arg-type]
        stop_reason=reason, best_source=source, best_report=report, best_strategy=strategy, best_params=params,
        best_candidate_id=run.winner.candidate_id if run.winner else None, beat_reference=run.winner is not None,
        speedup=_first_reading(run, report), confirmed_speedup=run.confirmed_speedup, confirmation=run.confirmation,
        baseline_speedup=baseline.speedup if baseline is not None else None,
        baseline_speedup_ci=baseline.interval if baseline is not None else None, bar=run.bar, note=run.note,
        speedup_ci=report.interval if report is not None else None,
        claim=policy.claim(report.interval, run.cleared(report)) if run.winner is not None and report is not None
        else "at par",
        verdict=_verdict(run, report),
        iterations=run.iterations, attempts=list(run.history.values()), trials=trial_rows(messages),
        evaluations=run.evaluations, first_correct_at=run.first_correct_at,
        # the reference handed back was found by no one: no best_at (first_correct_at <= best_at where both are)
        best_at=evaluation_index(messages, _first_report(run, report)) if strategy != REFERENCE else None,
        tokens=ledger.tokens,
        cost_usd=round(ledger.cost_usd, 6), recalled=run.recalled, remembered_kernel=kernel_id,
        remembered_note=note_id, seconds=round(time.monotonic() - run.started, 3), resumed_evaluations=carried,
        resumed_seconds=round(run.carried_s, 3))
    log.info("auto.finished", session=session_id, task=task.id, status=status, reason=reason,
             evaluations=result.evaluations, speedup=result.speedup, confirmed=result.confirmed_speedup)
    return result


def _verdict(run: AutoRun, report: JudgeReport | None) -> str:
    """What may be said of the returned kernel: faster only for a confirmed winner that clears the bar
    (``actors.policy.cleared``); otherwise the run's note (what was best and how the reference itself read, or
    that nothing was tried)."""
    if run.winner is not None and report is not None:
        return policy.describe(report.speedup, report.interval, run.cleared(report))
    return run.note or "nothing beat the reference"


def _first_report(run: AutoRun, report: JudgeReport | None) -> JudgeReport | None:
    """The first judgement of the returned kernel (the winner's before it was re-measured)."""
    if run.winner is not None:
        return next((c.report for c in run.scored if c.candidate_id == run.winner.candidate_id), report)
    return report


def _first_reading(run: AutoRun, report: JudgeReport | None) -> float | None:
    first = _first_report(run, report)
    return first.speedup if first is not None else None


def auto(task_id: str, config: ActorConfig | None = None, **kwargs: Any) -> AutoResult:
    """Blocking form of ``run_auto``."""
    return asyncio.run(run_auto(task_id, config, **kwargs))
