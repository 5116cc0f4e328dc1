"""HITL driven through a real terminal (pexpect): plan edited in $EDITOR, kernel approved, judged,
profiled, a tuning run rejected, an edit undone, the kernel accepted; then the session resumed."""

from __future__ import annotations

import pytest
import re
import sys
from pathlib import Path

import pexpect

from actors import policy
from maxkernel.config import load_settings
from memory import Memory, Store

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "maxkernel> "
ASK = r"approve, edit or reject\? \[a/e/r\] "

EDITOR = '''import sys
path = sys.argv[1]
text = open(path).read()
if path.endswith(".txt"):   # a plan: keep the first strategy only
    text = "\\n".join(line for line in text.splitlines() if line.startswith("1.")) + "\\n"
else:                       # a kernel: leave a mark
    text += "\\n# edited by a person\\n"
open(path, "w").write(text)
'''


def _spawn(args: list[str], env: dict[str, str]) -> pexpect.spawn:
    child = pexpect.spawn(sys.executable, ["-m", "orchestrators.hitl", *args], cwd=str(ROOT), env=env,
                          encoding="utf-8", timeout=240, dimensions=(60, 200))
    return child


def _say(child: pexpect.spawn, line: str, expect: str | list[str] = PROMPT) -> str:
    child.sendline(line)
    child.expect(expect)
    return child.before


@pytest.mark.slow
def test_chat_in_a_terminal(tmp_path: Path, fast_env: dict[str, str]) -> None:
    import os

    editor = tmp_path / "editor.py"
    editor.write_text(EDITOR)
    env = dict(os.environ) | {"EDITOR": f"{sys.executable} {editor}", "TERM": "dumb"}
    child = _spawn(["12p_RMSNorm", "--brain", "rules"], env)
    child.expect(PROMPT)
    assert "type help" in child.before
    assert "commands only" in _say(child, "make it faster please")
    assert "implement [N]" in _say(child, "help")

    shown = _say(child, "plan", ASK)
    assert "1. template:rowblock" in shown and "2. reference" in shown
    assert "plan edited and taken" in _say(child, "e")
    assert "2. reference" not in _say(child, "show plan")

    kernel = _say(child, "implement", ASK)
    assert "pallas_call" in kernel
    _say(child, "a")
    assert "status ok, correct True" in _say(child, "validate")
    tested = _say(child, "test")
    assert re.search(r"speedup [0-9.]+x( \([0-9.]+–[0-9.]+x\))? \(measured\)", tested), tested
    assert "bound:" in _say(child, "profile")
    child.sendline("tune")
    # A tuning run that found nothing better asks nothing; one that did asks, and is rejected here.
    asked = child.expect([ASK, "tuning found nothing better than the current kernel"]) == 0
    if asked:
        assert "tuned:" in child.before
        assert "tune rejected" in _say(child, "r")
    else:
        child.expect(PROMPT)

    again = _say(child, "implement", ASK)
    assert "(same as the previous kernel)" in again
    assert "kernel edited and taken" in _say(child, "e")
    assert "# edited by a person" in _say(child, "show kernel")
    assert "undone" in _say(child, "undo")
    assert "# edited by a person" not in _say(child, "show kernel")
    assert "nothing to fix" in _say(child, "fix")
    _say(child, "test")
    accepted = _say(child, "accept")
    kernel_id = re.search(r"remembered as ([0-9a-f]+)", accepted).group(1)
    assert "the reference" in accepted  # said over the reference's own reading, measured before accepting
    history = _say(child, "history")
    for entry in ("edit: plan", "approve: kernel", *(["redirect: tune rejected"] if asked else []), "edit: kernel as",
                  "redirect: undo — took back kernel", f"approve: accepted kernel {kernel_id}"):
        assert entry in history, (entry, history)
    child.sendline("quit")
    child.expect(r"--resume ([0-9a-f]+)")
    session_id = child.match.group(1)
    child.expect(pexpect.EOF)

    resumed = _spawn(["12p_RMSNorm", "--resume", session_id], env)
    resumed.expect(PROMPT)
    assert f"resumed session {session_id}" in resumed.before
    kernel_now = _say(resumed, "show kernel")
    assert "pallas_call" in kernel_now and "# edited by a person" not in kernel_now
    assert "edit: plan" in _say(resumed, "history")
    assert "status ok" in _say(resumed, "show report")
    resumed.sendline("quit")
    resumed.expect(pexpect.EOF)

    settings = load_settings()
    with Store.open(settings.resolved_store_url) as store:
        types = [e.message_type for e in store.events(session_id=session_id)]
        assert types.count("HumanDecision") >= 9 and "HumanPrompt" in types and "EvalReport" in types
        assert store.get_session(session_id).status == "accepted"
        # as Auto does: the reference run as a candidate (again while suspect) is the bar of the confirmation runs
        judged = [(e.payload.get("draft") or {}).get("produced_by") for e in store.events(session_id=session_id)
                  if e.message_type == "EvalReport"]
        assert 1 <= judged.count(policy.BASELINE) <= 3 and policy.CONFIRM in judged
    with Memory.open(settings) as memory:
        assert memory.get(kernel_id).session_id == session_id


@pytest.mark.slow
def test_chat_with_the_llm_brain_through_replay(tmp_path: Path, fast_env: dict[str, str]) -> None:
    """Free text reaches the model; a failing kernel is fixed on request; a tuning variant is approved."""
    import asyncio
    import json

    from actors.config import ActorConfig
    from maxkernel.llm.transcript import Exchange, append_exchange
    from orchestrators.hitl import run_chat
    from transcripts import PLANNER_REPLY, PROFILER_REPLY, fenced, kernel_source, text

    transcript = tmp_path / "chat.jsonl"
    for actor, result in [
        ("planner", text(PLANNER_REPLY)),
        ("coder", text(fenced(kernel_source(broken=True)))),
        ("debugger", text("`VMEM` lives in `pltpu`.\n" + fenced(kernel_source()))),
        ("profiler", text(PROFILER_REPLY)),
        ("tuner", text("VARIANT: bm=512\n" + fenced(kernel_source((512, 512, 1024))))),
    ]:
        append_exchange(transcript, Exchange(actor=actor, model="replay", result=result))
    recording = tmp_path / "recorded.jsonl"
    lines = iter(["keep the accumulator in f32 please", "plan", "a", "implement", "a", "test", "fix", "a", "test",
                  "profile", "tune", "a", "accept", "history", "quit"])
    said: list[str] = []
    config = ActorConfig(brain="llm", model="replay", transcript=transcript, record_to=recording)
    session_id = asyncio.run(run_chat("41k_Gemm_Add_ReLU", config, read=lambda _p: next(lines), write=said.append))
    out = "\n".join(said)
    assert "noted: the next plan and kernel will get it" in out
    assert "status compile_error" in out and "pltpu" in out  # the failure, then the fix shown as a diff
    # The tuner's variant is kept only when it beats the kernel; otherwise the chat asks nothing (the "a" meant
    # for the question is then guidance) and says so.
    assert ("tuned:" in out or "tuning found nothing better than the current kernel" in out) and "accepted:" in out
    assert "redirect: guidance: keep the accumulator in f32 please" in out and "approve: fix" in out
    coder = [json.loads(line) for line in recording.read_text().splitlines() if json.loads(line)["actor"] == "coder"]
    assert "keep the accumulator in f32 please" in json.dumps(coder[0]["messages"])
    with Store.open(load_settings().resolved_store_url) as store:
        assert store.get_session(session_id).status == "accepted"
