"""What an LLM brain is shown of memory: with a replay client recording the exchange, the planner's and
coder's prompts hold the recalled kernels and notes, how strategies fared on similar tasks, and the closest
expert kernel of the installed JAX read from its source."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from actors.brains.base import Tools
from actors.brains.llm import LlmBrain
from actors.config import ActorConfig
from actors.prompting import OPS, expert_for, kernel_excerpt
from actors.services import Services
from maxkernel.llm.transcript import Exchange, append_exchange, read_transcript
from maxkernel.messages import Budget, OptimizeRequest, Plan, Recall, RecalledKernel, RecalledNote, StrategyRef
from measured_sessions import record_session
from transcripts import PLANNER_REPLY, TASK, fenced, kernel_source, text

RECALLED_CODE = "def kernel(x, w, b):\n    return recalled_marker_kernel(x, w, b)\n"
NOTE = "template:rowblock on cpu: 1.4x; block_rows 512 beat 128 (recalled note marker)"


def _brain(role: str, services: Services) -> LlmBrain:
    task = services.task(TASK)
    recall = Recall(session_id="s", task_id=TASK, kernels=[RecalledKernel(id="k1", task_id="35k_Gemm_Scaling_Hardtanh_GELU",
                    score=0.8, strategy="template:rowblock", speedup=1.4, code=RECALLED_CODE)],
                    notes=[RecalledNote(id="n1", score=0.7, outcome="worked", text=NOTE)])

    async def evaluate(source: str, timing: bool):  # the replayed replies call no tool
        raise AssertionError("no evaluation expected")

    async def recalled() -> Recall:
        return recall

    tools = Tools(task=task, target="cpu", size="cpu", evaluate=evaluate, recall=recalled)
    return LlmBrain(role, services, tools, services.client("s", role, Budget()))


def _prompt(record: Path, actor: str) -> str:
    exchange = next(e for e in read_transcript(record) if e.actor == actor)
    return json.dumps(exchange.messages)


def test_planner_and_coder_prompts_carry_memory_and_the_expert_kernel(tmp_path: Path) -> None:
    transcript, record = tmp_path / "replay.jsonl", tmp_path / "recorded.jsonl"
    append_exchange(transcript, Exchange(actor="planner", model="replay", result=text(PLANNER_REPLY)))
    append_exchange(transcript, Exchange(actor="coder", model="replay", result=text(fenced(kernel_source()))))
    config = ActorConfig(brain="llm", model="replay", transcript=transcript, record_to=record,
                         data_dir=str(tmp_path / "data"))
    services = Services(config)
    try:
        record_session(services.store, "35k_Gemm_Scaling_Hardtanh_GELU",
                       [StrategyRef(name="template:rowblock", kind="template"), StrategyRef(name="reference", kind="reference")],
                       {"template:rowblock": ("ok", 1.4)})
        planner = _brain("planner", services)
        request = OptimizeRequest(session_id="s", task_id=TASK)
        outcome = asyncio.run(planner.plan(request, asyncio.run(planner.tools.recall())))
        assert outcome.strategies[0].name == "tiled-matmul-epilogue"
        coder = _brain("coder", services)
        plan = Plan(session_id="s", task_id=TASK, strategies=outcome.strategies, notes=outcome.notes)
        assert "pallas_call" in asyncio.run(coder.draft(plan))
    finally:
        asyncio.run(services.aclose())

    expert = (OPS / "tpu" / "matmul.py").read_text()
    marker = next(line for line in expert.splitlines() if line.startswith("def "))  # a line of the real file
    for actor in ("planner", "coder"):
        prompt = _prompt(record, actor)
        assert "recalled_marker_kernel" in prompt and "recalled note marker" in prompt
        assert "jax/experimental/pallas/ops/tpu/matmul.py" in prompt and json.dumps(marker)[1:-1] in prompt
    planner_prompt = _prompt(record, "planner")
    assert "How strategies fared on similar tasks" in planner_prompt
    assert "template:rowblock: won on 35k_Gemm_Scaling_Hardtanh_GELU" in planner_prompt


def test_expert_choice_follows_the_analysis() -> None:
    assert expert_for(["softmax", "attention", "matmul"], ["dot_general", "exp"], "tpu-v5e") == "tpu/flash_attention.py"
    assert expert_for(["attention", "gather"], [], "cpu") == "tpu/paged_attention/paged_attention_kernel.py"
    assert expert_for(["softmax", "attention"], [], "gpu-h100") == "gpu/attention.py"
    assert expert_for([], ["ragged_dot_general"], "cpu") == "tpu/megablox/gmm.py"
    assert expert_for(["rmsnorm"], [], "cpu") == "gpu/rms_norm.py"
    assert expert_for(["matmul", "matmul_epilogue"], [], "cpu") == "tpu/matmul.py"
    assert expert_for(["elementwise"], ["add"], "cpu") is None


def test_long_expert_files_keep_their_kernel_definitions() -> None:
    source = (OPS / "tpu" / "flash_attention.py").read_text()
    excerpt = kernel_excerpt(source, 8000)
    assert len(excerpt) <= 8200 and "import" in excerpt and "def _flash_attention_kernel" in excerpt
    assert not excerpt.startswith("#")  # the license header is left out
    short = (OPS / "tpu" / "matmul.py").read_text()
    assert kernel_excerpt(short, 8000).strip() in short and "pallas_call" in kernel_excerpt(short, 8000)
