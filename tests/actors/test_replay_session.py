"""The full actor loop driven by a replay transcript, judged by the real evaluator, logged in real SQLite.

plan -> draft with a compile error -> debugger fix -> correct kernel -> profile -> tune -> scored candidate.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from actors import ActorConfig, run_session
from actors.services import Services
from maxkernel.llm.transcript import read_transcript
from maxkernel.messages import Budget
from transcripts import TASK, gemm_session
from actor_fixtures import actor_evaluator, data_dir  # noqa: F401 (pytest fixtures)

FLOW = ["OptimizeRequest", "Plan", "KernelDraft", "FixRequest", "KernelDraft", "EvalReport", "ProfileReport",
        "TuneReport", "CandidateScored", "SessionFinished"]


def _run(config: ActorConfig, evaluator: object, budget: Budget | None = None):  # type: ignore[no-untyped-def]
    services = Services(config, evaluator=evaluator)  # type: ignore[arg-type]
    result = asyncio.run(run_session(TASK, config, services=services, budget=budget, timeout_s=400))
    events = services.store.events(session_id=result.session_id)
    memory = services.memory
    return result, events, services, memory


def _flow(events: list) -> list:
    """The main line of the session: the events of FLOW's types, without tool checks and tuning trials."""
    out = []
    for e in events:
        if e.message_type not in FLOW:
            continue
        if e.message_type == "EvalReport" and e.payload["draft"]["produced_by"].endswith(":tool"):
            continue
        out.append(e)
    return out


@pytest.mark.slow
def test_replay_drives_the_full_loop(tmp_path: Path, data_dir: Path, actor_evaluator: object) -> None:
    transcript = gemm_session(tmp_path / "gemm.jsonl")
    recording = tmp_path / "recorded.jsonl"
    config = ActorConfig(brain="llm", model="replay", transcript=transcript, record_to=recording,
                         data_dir=str(data_dir))
    result, events, services, memory = _run(config, actor_evaluator)
    try:
        assert result.status == "scored", result.reason
        assert result.report is not None and result.report.passed and result.report.label == "pallas-kernel"

        flow = _flow(events)
        assert [e.message_type for e in flow] == FLOW
        seqs = [e.seq for e in flow]
        assert seqs == sorted(seqs)
        first, fix, fixed, ok = flow[2], flow[3], flow[4], flow[5]
        assert fix.payload["report"]["status"] == "compile_error"
        assert "VMEM" in fix.payload["report"]["reason"]
        assert fixed.payload["parent_id"] == first.candidate_id
        assert fixed.payload["produced_by"] == "debugger:llm"
        assert ok.candidate_id == fixed.candidate_id and ok.payload["report"]["status"] == "ok"
        assert flow[-1].payload["status"] == "scored"
        assert all(e.session_id == result.session_id for e in events)

        trials = [e for e in events if e.message_type == "EvalReport" and e.payload["draft"]["produced_by"] == "tuner:tool"]
        assert len(trials) == 2 and len(flow[7].payload["trials"]) == 2

        usage = [e.payload for e in events if e.message_type == "TokenUsage"]
        assert sorted({u["actor"] for u in usage}) == ["coder", "debugger", "planner", "profiler", "tuner"]
        assert sum(u["prompt_tokens"] + u["completion_tokens"] for u in usage) == result.tokens > 0
        assert max(u["session_tokens"] for u in usage) == result.tokens

        # Both drafts are candidates of the session; the failing one carries its compile_error evaluation.
        assert services.store.get_candidate(first.candidate_id).session_id == result.session_id
        assert services.store.evaluations(first.candidate_id)[0].report.status == "compile_error"
        assert services.store.get_session(result.session_id).status == "scored"
        hits = memory.recall_kernels(TASK, k=3)
        assert hits and hits[0].kernel.task_id == TASK and hits[0].kernel.session_id == result.session_id

        # The coder looked up an API through its tool: the recording holds the tool's real answer.
        recorded = read_transcript(recording)
        coder = [x for x in recorded if x.actor == "coder"]
        assert len(coder) == 2
        tool_results = [m for m in coder[1].messages if m["type"] == "FunctionExecutionResultMessage"]
        assert tool_results and "jax.experimental.pallas.tpu.VMEM" in tool_results[0]["content"][0]["content"]
        assert [x.actor for x in recorded] == [x.actor for x in read_transcript(transcript)]
    finally:
        services.store.close()
        memory.close()

    # The recording replays the session exactly: same steps, same final kernel.
    again_config = ActorConfig(brain="llm", model="replay", transcript=recording, data_dir=str(tmp_path / "again"))
    again, again_events, services2, memory2 = _run(again_config, actor_evaluator)
    try:
        assert again.status == "scored"
        assert [e.message_type for e in _flow(again_events)] == FLOW
        assert again.tokens == result.tokens
        fixed_again = _flow(again_events)[4]
        assert fixed_again.payload["source"] == fixed.payload["source"]
    finally:
        services2.store.close()
        memory2.close()


def test_token_budget_stops_the_session_cleanly(tmp_path: Path, data_dir: Path, actor_evaluator: object) -> None:
    transcript = gemm_session(tmp_path / "gemm.jsonl")
    config = ActorConfig(brain="llm", model="replay", transcript=transcript, data_dir=str(data_dir))
    result, events, services, memory = _run(config, actor_evaluator, Budget(max_tokens=1000))
    try:
        assert result.status == "budget"
        assert "token budget spent: 1600 of 1000 tokens" in result.reason
        types = [e.message_type for e in events]
        # The coder recalled (memory is free) but its model call was refused: no draft, no evaluation.
        assert types == ["OptimizeRequest", "Recall", "Plan", "TokenUsage", "Recall", "SessionFinished"], types
        assert events[-1].payload["status"] == "budget"
        assert services.store.get_session(result.session_id).status == "budget"
    finally:
        services.store.close()
        memory.close()


def test_money_budget(tmp_path: Path, data_dir: Path, actor_evaluator: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """Priced usage: replies booked at a price from the table stop the session at its dollar limit."""
    from maxkernel.llm import presets

    table = presets.models()
    priced = table.model_copy(update={"prices": {**table.prices, "replay": presets.Price(input=1000.0, output=1000.0)}})
    monkeypatch.setattr(presets, "models", lambda: priced)
    monkeypatch.setattr("maxkernel.llm.factory.models", lambda: priced)
    transcript = gemm_session(tmp_path / "gemm.jsonl")
    config = ActorConfig(brain="llm", model="replay", transcript=transcript, data_dir=str(data_dir))
    result, events, services, memory = _run(config, actor_evaluator, Budget(max_cost_usd=1.0))
    try:
        assert result.status == "budget" and "money budget spent: $1.6000 of $1.0000" in result.reason
        usage = [e.payload for e in events if e.message_type == "TokenUsage"]
        assert usage[0]["cost_usd"] == pytest.approx(1.6)
    finally:
        services.store.close()
        memory.close()
