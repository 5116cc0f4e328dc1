"""The tester's extra edge-case inputs catch a kernel that passes the judge's ordinary inputs."""

from __future__ import annotations

import pytest
import asyncio
from pathlib import Path

from actors import ActorConfig, run_session
from actors.services import Services
from transcripts import SOFTMAX_TASK, softmax_session
from actor_fixtures import actor_evaluator, data_dir  # noqa: F401 (pytest fixtures)


@pytest.mark.slow
def test_scaled_up_inputs_catch_an_unstable_softmax(tmp_path: Path, data_dir: Path, actor_evaluator: object) -> None:
    config = ActorConfig(brain="llm", model="replay", transcript=softmax_session(tmp_path / "softmax.jsonl"),
                         data_dir=str(data_dir), edge_cases=["negated", "scaled_up"])
    services = Services(config, evaluator=actor_evaluator)  # type: ignore[arg-type]
    try:
        result = asyncio.run(run_session(SOFTMAX_TASK, config, services=services, timeout_s=400))
        events = services.store.events(session_id=result.session_id)
    finally:
        services.store.close()
        services.memory.close()
    assert result.status == "scored", result.reason
    fix = [e.payload for e in events if e.message_type == "FixRequest"]
    assert len(fix) == 1
    checks = {c["name"]: c["passed"] for c in fix[0]["report"]["checks"]}
    # The unstable kernel passed every ordinary check and the negated inputs; scaled-up inputs broke it.
    assert checks["correct_inputs_seed_0"] and checks["edge_negated"] and not checks["edge_scaled_up"]
    assert fix[0]["report"]["reason"].startswith("edge case 'scaled_up'")
    assert fix[0]["report"]["status"] == "incorrect"
    final = {c.name: c.passed for c in result.report.checks}
    assert final["edge_negated"] and final["edge_scaled_up"]
