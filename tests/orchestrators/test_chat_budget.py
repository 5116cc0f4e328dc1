"""A chat's --evals and --budget: steps that would overspend are refused in one line, the limits survive a
resume from the event log, and a resume given a larger --evals goes on."""

from __future__ import annotations

import pytest
import asyncio

from actors.config import ActorConfig
from orchestrators.hitl import ChatLimits, run_chat

NORM = "12p_RMSNorm"


def _chat(lines: list[str], limits: ChatLimits, resume: str | None = None) -> tuple[str, str]:
    said: list[str] = []
    answers = iter(lines)
    session = asyncio.run(run_chat(NORM, ActorConfig(brain="rules"), resume=resume, limits=limits,
                                   read=lambda _prompt: next(answers), write=said.append))
    return session, "\n".join(said)


@pytest.mark.slow
def test_the_evaluation_budget_holds_across_a_resume_and_a_larger_one_extends_it(fast_env: dict[str, str]) -> None:
    session, out = _chat(["plan", "a", "implement", "a", "test", "test", "show budget", "history", "quit"],
                         ChatLimits(max_evaluations=1))
    assert out.count("status ok") == 1
    assert "evaluation budget spent (1 of 1)" in out
    assert "budget: 1 evaluations; spent: 1 evaluations" in out
    assert "redirect: limits — budget: 1 evaluations" in out  # the history says what the limits are

    # Resumed with no flag: the stored limit holds (read back from the event log).
    _, out = _chat(["test", "quit"], ChatLimits(), resume=session)
    assert "evaluation budget spent (1 of 1)" in out and "status ok" not in out

    # Resumed with a larger --evals: the next test runs; accept has no evaluation left to re-measure with.
    _, out = _chat(["test", "accept", "show budget", "quit"], ChatLimits(max_evaluations=2), resume=session)
    assert "status ok" in out
    assert "not accepted: it must be measured again first" in out and "(2 of 2)" in out
    assert "budget: 2 evaluations; spent: 2 evaluations" in out


def test_the_time_budget_stops_agent_steps_but_not_looking(fast_env: dict[str, str]) -> None:
    _, out = _chat(["plan", "a", "implement", "show plan", "history", "quit"], ChatLimits(time_s=0.001))
    assert "time budget of 0.001 s spent" in out
    assert "1. template:rowblock" in out  # show still answers
    assert "the coder" not in out and "pallas_call" not in out  # implement never ran
