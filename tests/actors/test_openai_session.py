"""The LLM brain on an OpenAI-compatible server (loopback, /v1/chat/completions) through autogen-ext's
client: rate limits and 5xx are retried, a reply without code is sent back with the reason, a crashed actor
is restarted and its message re-delivered, and the session still ends with a scored kernel."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from actors import ActorConfig, run_session
from actors.services import Services
from servers import Reply, ScriptedServer, openai_call, openai_error, openai_text
from transcripts import PLANNER_REPLY, PROFILER_REPLY, TASK, fenced, kernel_source
from actor_fixtures import actor_evaluator, data_dir  # noqa: F401 (pytest fixtures)


@pytest.fixture
def server():
    s = ScriptedServer().start()
    yield s
    s.stop()


@pytest.mark.slow
def test_openai_compatible_session_survives_faults(server: ScriptedServer, data_dir: Path,
                                                   actor_evaluator: object) -> None:
    server.replies += [
        Reply(body=openai_text(PLANNER_REPLY)),                                # planner
        Reply(503, openai_error(503, "overloaded")),                           # coder: retried
        Reply(429, openai_error(429, "slow down")),                            # coder: retried
        Reply(raw=b'{"id": "x", "object": "chat.completion", "choices": []}'),  # coder: crashes the actor
        Reply(body=openai_call("lookup_api", {"name": "pl.BlockSpec"})),       # coder after restart: a tool
        Reply(body=openai_text("I would tile the matmul.")),                   # no code: sent back
        Reply(body=openai_text(fenced(kernel_source()))),                      # coder: a correct kernel
        Reply(body=openai_text(PROFILER_REPLY)),                               # profiler
        Reply(body=openai_text("No variant beats it.")),                       # tuner: nothing to try
    ]
    config = ActorConfig(brain="llm", model="vllm", base_url=f"{server.url}/v1", data_dir=str(data_dir),
                         retry_base_delay_s=0.01)
    services = Services(config, evaluator=actor_evaluator)  # type: ignore[arg-type]
    try:
        result = asyncio.run(run_session(TASK, config, services=services, timeout_s=300))
        events = services.store.events(session_id=result.session_id)
    finally:
        services.store.close()
        services.memory.close()

    assert result.status == "scored", result.reason
    assert result.report is not None and result.report.passed
    assert not server.replies, "every scripted reply was consumed"
    paths = {r.path for r in server.received}
    assert paths == {"/v1/chat/completions"}
    assert all(r.body["model"] == "Qwen/Qwen2.5-Coder-32B-Instruct" for r in server.received)

    restarted = [e.payload for e in events if e.message_type == "ActorRestarted"]
    assert len(restarted) == 1 and restarted[0]["actor"] == "coder" and restarted[0]["redelivered"] == "Plan"
    types = [e.message_type for e in events]
    assert types.index("ActorRestarted") < types.index("KernelDraft")
    assert types.count("KernelDraft") == 1 and "ActorFailed" not in types

    # The tool's answer and then the reason for sending the code-less reply back reached the model.
    coder_last = server.received[6].body["messages"]
    assert any(m["role"] == "tool" and "BlockSpec" in (m.get("content") or "") for m in coder_last)
    assert "no fenced ```python code block" in coder_last[-1]["content"]
    assert server.received[0].body["messages"][0]["role"] == "system"
    # The coder's prompt: Pallas guidance (system), then the task, its reference, memory and the strategy.
    coder_first = server.received[1].body["messages"]
    assert "Grid and BlockSpec" in coder_first[0]["content"]
    user = coder_first[1]["content"]
    for part in ("# Task 41k_Gemm_Add_ReLU", "def reference(x, weight, bias)", "## Memory", "tiled-matmul-epilogue"):
        assert part in user, part
    assert {t["function"]["name"] for t in server.received[1].body["tools"]} == {
        "check_kernel", "evaluate_kernel", "recall_memory", "lookup_api"}


def test_actor_that_keeps_crashing_is_reported(server: ScriptedServer, data_dir: Path, actor_evaluator: object) -> None:
    garbage = b'{"id": "x", "object": "chat.completion", "choices": []}'
    server.replies += [Reply(raw=garbage), Reply(raw=garbage)]
    config = ActorConfig(brain="llm", model="vllm", base_url=f"{server.url}/v1", data_dir=str(data_dir),
                         retry_base_delay_s=0.01, max_restarts=1)
    services = Services(config, evaluator=actor_evaluator)  # type: ignore[arg-type]
    try:
        result = asyncio.run(run_session(TASK, config, services=services, timeout_s=120))
        events = services.store.events(session_id=result.session_id)
    finally:
        services.store.close()
        services.memory.close()
    assert result.status == "error"
    assert result.reason.startswith("planner failed on OptimizeRequest: IndexError")
    failed = [e.payload for e in events if e.message_type == "ActorFailed"]
    assert len(failed) == 1 and failed[0]["message_type"] == "OptimizeRequest"
    assert failed[0]["message"]["task_id"] == TASK  # the lost message is in the log, whole
    assert [e.message_type for e in events].count("ActorRestarted") == 1


def test_plan_without_strategies_is_sent_back_then_fails_cleanly(server: ScriptedServer, data_dir: Path) -> None:
    server.replies += [Reply(body=openai_text("I would write a fast kernel.")) for _ in range(3)]
    config = ActorConfig(brain="llm", model="vllm", base_url=f"{server.url}/v1", data_dir=str(data_dir),
                         max_reprompts=2)
    services = Services(config)
    try:
        result = asyncio.run(run_session(TASK, config, services=services, timeout_s=120))
    finally:
        services.store.close()
        services.memory.close()
    assert result.status == "failed"
    assert result.reason == "planner: no STRATEGY line after 2 re-prompts"
    assert len(server.received) == 3 and not server.replies
    assert "has no line of the form `STRATEGY:" in server.received[2].body["messages"][-1]["content"]
