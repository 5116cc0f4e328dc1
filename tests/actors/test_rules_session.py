"""The same actor loop with the rules brain (no model): a correct Pallas kernel for 41k_Gemm_Add_ReLU, and a
second session that starts from the kernel the librarian remembered."""

from __future__ import annotations

import pytest
import asyncio
from pathlib import Path

from actors import ActorConfig, run_session
from actors.services import Services
from maxkernel.messages import Budget
from transcripts import TASK
from actor_fixtures import actor_evaluator, data_dir  # noqa: F401 (pytest fixtures)


def _session(config: ActorConfig, evaluator: object) -> tuple:
    services = Services(config, evaluator=evaluator)  # type: ignore[arg-type]
    seen: list[str] = []
    try:
        result = asyncio.run(run_session(TASK, config, services=services, timeout_s=500,
                                         budget=Budget(tune_budget_s=60, tune_max_trials=2),
                                         on_message=lambda m: seen.append(type(m).__name__)))
        events = services.store.events(session_id=result.session_id)
        # A live view sees what the log records (the recorder's own copies of direct answers included).
        assert sorted(seen) == sorted(e.message_type for e in events)
        return result, events
    finally:
        services.store.close()
        services.memory.close()


@pytest.mark.slow
def test_rules_brain_produces_a_correct_kernel(data_dir: Path, actor_evaluator: object) -> None:
    config = ActorConfig(brain="rules", data_dir=str(data_dir))
    result, events = _session(config, actor_evaluator)
    assert result.status == "scored", result.reason
    assert result.report is not None and result.report.passed
    assert result.report.label == "pallas-kernel" and "pallas_call" in (result.source or "")
    assert result.tokens == 0  # no model was asked anything

    types = [e.message_type for e in events]
    for step in ("OptimizeRequest", "Recall", "Plan", "KernelDraft", "EvalReport", "ProfileReport", "TuneReport",
                 "CandidateScored", "Note", "SessionFinished"):
        assert step in types, (step, types)
    assert "TokenUsage" not in types
    plan = events[types.index("Plan")].payload
    assert plan["strategies"][0]["kind"] in ("rewrite", "template") and plan["analysis"]
    assert plan["strategies"][-1]["name"] == "reference"
    profile = events[types.index("ProfileReport")].payload
    assert profile["bound"] in ("compute", "memory") and "FLOP/byte" in profile["diagnosis"]
    tune = events[types.index("TuneReport")].payload
    # Two trials were allowed; the draft's own configuration, measured first at no cost, is not one of them.
    drafted = next(s["params"] for s in plan["strategies"] if s["name"] == tune["strategy"])
    spent = [t for t in tune["trials"] if any(drafted.get(k) != v for k, v in t["params"].items())]
    assert 1 <= len(tune["trials"]) <= 3 and len(spent) <= 2, tune["trials"]

    # A second session recalls the verified kernel and tries it first.
    again, again_events = _session(config, actor_evaluator)
    assert again.status == "scored"
    again_plan = next(e.payload for e in again_events if e.message_type == "Plan")
    assert again_plan["strategies"][0]["kind"] == "recalled"
    first_draft = next(e.payload for e in again_events if e.message_type == "KernelDraft")
    assert first_draft["source"] == result.source
