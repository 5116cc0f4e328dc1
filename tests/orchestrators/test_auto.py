"""Auto end to end: the rules brain over several iterations with feedback and memory (the baseline bar
first, confirmation last), and the LLM brain driven by a replay transcript (plan, broken draft, fix,
second strategy with the feedback, re-plan) under the same behaviour."""

from __future__ import annotations

import pytest
import asyncio
import json
from pathlib import Path

from actors.config import ActorConfig
from actors.services import Services
from maxkernel.llm.transcript import Exchange, append_exchange
from orchestrators.auto import AutoBudget, messages_of, run_auto, time_spent
from transcripts import PROFILER_REPLY, fenced, kernel_source, text

GEMM = "41k_Gemm_Add_ReLU"
NORM = "12p_RMSNorm"
SCALED = "30k_Matmul_Scaling_ResidualAdd"


def _auto(config: ActorConfig, evaluator: object, task: str, budget: AutoBudget):  # type: ignore[no-untyped-def]
    services = Services(config, evaluator=evaluator)  # type: ignore[arg-type]
    try:
        result = asyncio.run(run_auto(task, services=services, budget=budget))
        return result, services.store.events(session_id=result.session_id)
    finally:
        services.store.close()
        services.memory.close()


@pytest.mark.slow
def test_rules_auto_iterates_with_feedback_and_starts_from_memory(orch_evaluator: object) -> None:
    config = ActorConfig(brain="rules", remember=False)
    budget = AutoBudget(max_evaluations=12, time_s=400)
    result, events = _auto(config, orch_evaluator, NORM, budget)
    assert result.status == "scored", result.stop_reason
    assert result.best_report is not None and result.best_report.passed
    baseline = [t for t in result.trials if t.role == "baseline"]
    assert baseline and result.trials[: len(baseline)] == baseline and len(baseline) in (1, 3)
    assert result.bar >= 1.0 and result.baseline_speedup == baseline[0].speedup or len(baseline) == 3
    confirms = sum(1 for t in result.trials if t.role == "confirm")
    assert result.evaluations == len(baseline) + sum(i.evaluations for i in result.iterations) + confirms
    assert result.first_correct_at == len(baseline) + 1 and result.tokens == 0
    assert "nothing that was not tried" in result.stop_reason or "evaluation budget" in result.stop_reason
    # Either a kernel was confirmed above the bar, or the reference came back and the note says so.
    if result.beat_reference:
        assert result.confirmed_speedup is not None and result.confirmed_speedup >= result.bar and confirms >= 1
    else:
        assert result.best_strategy == "reference" and "nothing beat the reference" in result.note

    plans = [e.payload for e in events if e.message_type == "Plan"]
    assert "Tried so far\n- reference: correct" in plans[0]["notes"]  # the baseline is the first thing tried
    assert plans[0]["strategies"][0]["kind"] == "template"
    assert result.remembered_kernel and result.remembered_note

    # A new run starts from memory: the kernel just remembered is the first thing it tries.
    again, again_events = _auto(config, orch_evaluator, NORM, AutoBudget(max_evaluations=4, time_s=300))
    plan = next(e.payload for e in again_events if e.message_type == "Plan")
    assert plan["strategies"][0]["kind"] == "recalled" and again.recalled
    first = next(e.payload for e in again_events if e.message_type == "KernelDraft"
                 and not e.payload["produced_by"].startswith("auto:"))
    assert first["plan"]["strategies"][first["plan"]["step"]]["name"].startswith("recall:")
    assert again.stop_reason.startswith("evaluation budget spent") or "nothing that was not tried" in again.stop_reason
    assert again.status == "scored" and again.best_report is not None and again.best_report.passed


@pytest.mark.slow
def test_a_stale_iteration_does_not_end_a_run_while_budget_remains(orch_evaluator: object) -> None:
    """No patience by default: every strategy of the plan gets its turn, better or not."""
    config = ActorConfig(brain="rules", remember=False)
    result, events = _auto(config, orch_evaluator, SCALED,
                           AutoBudget(time_s=300, max_evaluations=None, confirm=False))
    worked = [s for it in result.iterations for s in it.strategies]
    assert len(worked) >= 3 and result.stop_reason == "the planner proposed nothing that was not tried already"
    # Whether a later iteration beats an earlier one depends on the machine's timings; what must hold is that
    # the default budget has no patience and that every strategy the planner proposed was worked on.
    assert AutoBudget().patience is None
    planned = {s["name"] for e in events if e.message_type == "Plan" for s in e.payload["strategies"]}
    assert planned <= {a.strategy for a in result.attempts}
    # Each iteration's plan carries what the earlier ones taught.
    handed = [e.payload for e in events if e.message_type == "Plan" and e.payload["sender"] == "orchestrator"]
    assert len(handed) == len(result.iterations) and worked[0] in handed[1]["notes"]
    # Every tuning trial is labelled with the strategy it tunes and hangs under that strategy's candidate:
    # the draft (or fix) judged just before it, not the session's first one.
    tuned, current, parent = 0, None, None
    drafts = {e.candidate_id: e.payload["draft"]["plan"]["strategies"][e.payload["draft"]["plan"]["step"]]["name"]
              for e in events if e.message_type == "EvalReport"}
    for row in result.trials:
        if row.role in ("draft", "fix"):
            current = row.strategy
        elif row.role == "tune":
            tuned += 1
            assert row.strategy == current, [(t.role, t.strategy) for t in result.trials]
    trials = [e for e in events if e.message_type == "EvalReport" and e.payload["draft"]["produced_by"] == "tuner:tool"]
    for e in trials:
        parent = e.payload["draft"]["parent_id"]
        assert drafts.get(parent) == drafts[e.candidate_id], (parent, drafts[e.candidate_id])
    assert tuned == len(trials) and len({drafts[e.candidate_id] for e in trials}) >= 2


@pytest.mark.slow
def test_a_job_run_again_carries_on_from_its_interrupted_run(orch_evaluator: object) -> None:
    config = ActorConfig(brain="rules", remember=False)
    first, _ = _auto(config, orch_evaluator, SCALED, AutoBudget(max_evaluations=4, tune_max_trials=1, time_s=300,
                                                                confirm=False))
    assert first.iterations and first.stop_reason.startswith("evaluation budget spent")
    assert first.evaluations >= 1 and first.best_report is not None and first.best_report.passed
    tried = {a.strategy for a in first.attempts}

    services = Services(config, evaluator=orch_evaluator)  # type: ignore[arg-type]
    try:
        prior = messages_of(services.store, [first.session_id])
        budget = AutoBudget(max_evaluations=first.evaluations + 2, tune_max_trials=1, time_s=300, confirm=False)
        again = asyncio.run(run_auto(SCALED, services=services, budget=budget, prior=prior))
        events = services.store.events(session_id=again.session_id)
    finally:
        services.store.close()
        services.memory.close()
    # The earlier evaluations count against the budget and are not repeated; its best is the bar.
    assert again.resumed_evaluations == first.evaluations
    assert again.evaluations == first.evaluations + sum(i.evaluations for i in again.iterations)
    assert again.bar == first.bar and not [t for t in again.trials if t.role == "baseline"][len(
        [t for t in first.trials if t.role == "baseline"]):]  # the interrupted run's baseline stands
    assert again.iterations and not tried & {s for it in again.iterations for s in it.strategies}
    assert tried <= {a.strategy for a in again.attempts}
    # Candidates rank by the lower end of their interval: the carried-over winner can only be beaten on it.
    assert again.best_report is not None and again.best_report.low >= first.best_report.low
    # The plan was carried over: the new session's first draft is the first strategy not tried before.
    draft = next(e.payload for e in events if e.message_type == "KernelDraft"
                 and not e.payload["produced_by"].startswith("auto:"))
    assert draft["plan"]["strategies"][draft["plan"]["step"]]["name"] not in tried
    assert not any(e.message_type == "OptimizeRequest" for e in events[:events.index(next(
        e for e in events if e.message_type == "KernelDraft"))])
    assert not any(e.payload.get("produced_by") == "auto:baseline" for e in events if e.message_type == "KernelDraft")


@pytest.mark.slow
def test_a_job_run_again_has_only_the_time_its_interrupted_run_left(orch_evaluator: object) -> None:
    """The time budget is the job's: a run carried on after an interruption that had spent all of it works on
    no new strategy (it only concludes), as the uninterrupted job would have ended there."""
    config = ActorConfig(brain="rules", remember=False)
    first, _ = _auto(config, orch_evaluator, SCALED, AutoBudget(max_evaluations=3, tune_max_trials=1, time_s=300,
                                                                confirm=False))
    assert first.iterations
    services = Services(config, evaluator=orch_evaluator)  # type: ignore[arg-type]
    try:
        prior = messages_of(services.store, [first.session_id])
        spent = time_spent(prior)
        assert 0 < spent <= first.seconds
        budget = AutoBudget(max_evaluations=first.evaluations + 4, tune_max_trials=1, time_s=spent, confirm=False)
        again = asyncio.run(run_auto(SCALED, services=services, budget=budget, prior=prior))
    finally:
        services.store.close()
        services.memory.close()
    assert again.resumed_seconds == round(spent, 3) and again.resumed_evaluations == first.evaluations
    assert not again.iterations and again.stop_reason == f"time budget of {spent} s spent"
    assert again.evaluations == first.evaluations


def test_time_spent_counts_each_session_from_its_first_message_to_its_last() -> None:
    from datetime import datetime, timedelta, timezone

    from maxkernel.messages import SessionFinished

    at = datetime(2026, 1, 1, tzinfo=timezone.utc)
    rows = [("a", 0.0), ("a", 4.0), ("b", 100.0), ("a", 2.5), ("b", 101.5)]
    messages = [SessionFinished(session_id=s, task_id="t", status="scored", sent_at=at + timedelta(seconds=t))
                for s, t in rows]
    assert time_spent(messages) == 5.5  # 4 s of a, 1.5 s of b; the 96 s between them are not the job's
    assert time_spent([]) == 0.0


def _transcript(path: Path) -> Path:
    rows = [
        ("planner", text("STRATEGY: tiled-a | grid over M, N, K with an f32 accumulator\n"
                         "STRATEGY: tiled-b | the same with 512-row tiles\n"
                         "NOTES: weight is [N, K]: contract dim 1 of both blocks.")),
        ("coder", text(fenced(kernel_source(broken=True)))),
        ("debugger", text("`VMEM` lives in `pltpu`.\n" + fenced(kernel_source()))),
        ("profiler", text(PROFILER_REPLY)),
        ("tuner", text("No variant is worth trying here.")),
        ("coder", text(fenced(kernel_source((512, 512, 1024))))),
        ("profiler", text(PROFILER_REPLY)),
        ("tuner", text("No variant is worth trying here.")),
        ("planner", text("STRATEGY: tiled-a | the accumulator grid again")),
    ]
    for actor, result in rows:
        append_exchange(path, Exchange(actor=actor, model="replay", result=result))
    return path


@pytest.mark.slow
def test_llm_auto_through_replay(tmp_path: Path, orch_evaluator: object) -> None:
    recording = tmp_path / "recorded.jsonl"
    config = ActorConfig(brain="llm", model="replay", transcript=_transcript(tmp_path / "auto.jsonl"),
                         record_to=recording, remember=False)
    result, events = _auto(config, orch_evaluator, GEMM, AutoBudget(max_evaluations=14, time_s=400))
    assert result.status == "scored", result.stop_reason
    assert result.stop_reason == "the planner proposed nothing that was not tried already"
    assert [i.strategies for i in result.iterations] == [["tiled-a"], ["tiled-b"]]
    assert {a.strategy: a.status for a in result.attempts} == {"tiled-a": "ok", "tiled-b": "ok", "reference": "ok"}
    # The same behaviour as the rules brain: the baseline first, the kernels' three evaluations, confirmation.
    roles = [t.role for t in result.trials]
    assert roles.count("draft") + roles.count("fix") == 3 and roles[0] == "baseline" and result.tokens > 0
    assert result.evaluations == len(roles) and (not result.beat_reference or "confirm" in roles)
    types = [e.message_type for e in events]
    assert types.count("FixRequest") == 1 and types.count("SessionFinished") == 2

    # The coder of the second iteration was told what the first one found.
    coder_calls = [json.loads(line) for line in recording.read_text().splitlines()
                   if json.loads(line)["actor"] == "coder"]
    assert len(coder_calls) == 2
    assert "Tried so far" in json.dumps(coder_calls[1]["messages"]) and "tiled-a: correct" in json.dumps(coder_calls[1]["messages"])
    assert "tiled-a" not in json.dumps(coder_calls[0]["messages"]).split("Tried so far")[-1]
    assert "reference: correct" in json.dumps(coder_calls[0]["messages"])  # the baseline, tried before it
