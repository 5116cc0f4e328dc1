"""A missing API key ends in one line naming the variable and suggesting --brain rules."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from actors import ActorConfig, run_session
from maxkernel import optimize
from actors.services import Services
from maxkernel.llm.errors import MissingApiKeyError, TranscriptError
from transcripts import TASK
from actor_fixtures import data_dir  # noqa: F401 (pytest fixtures)


@pytest.fixture(autouse=True)
def _no_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("GEMINI_API_KEY", "GOOGLE_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)


def test_gemini_without_key() -> None:
    with pytest.raises(MissingApiKeyError) as err:
        optimize(TASK, brain="gemini")
    message = str(err.value)
    assert "\n" not in message
    assert message == ("gemini-3.1-pro-preview: no API key: set GEMINI_API_KEY or GOOGLE_API_KEY, "
                       "or run with --brain rules (needs no model)")


def test_openai_without_key() -> None:
    with pytest.raises(MissingApiKeyError, match=r"^openai: no API key: set OPENAI_API_KEY, or run with --brain rules"):
        optimize(TASK, brain="openai")


def test_google_api_key_is_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    from maxkernel.llm.factory import api_key
    from maxkernel.llm.presets import models

    monkeypatch.setenv("GOOGLE_API_KEY", "g-key")
    assert api_key(models().preset("gemini-2.5-flash")) == "g-key"


def test_replay_without_transcript() -> None:
    with pytest.raises(TranscriptError, match="no transcript file given"):
        optimize(TASK, brain="replay")


def test_key_missing_inside_a_session_ends_it_with_the_line(data_dir: Path) -> None:
    """An actor that meets a missing key mid-session (a per-role model) stops the session with that line."""
    config = ActorConfig(brain="llm", model="gemini-2.5-flash", data_dir=str(data_dir))
    services = Services(config)
    try:
        result = asyncio.run(run_session(TASK, config, services=services, timeout_s=120))
    finally:
        services.store.close()
        services.memory.close()
    assert result.status == "error"
    assert result.reason == ("gemini-2.5-flash: no API key: set GEMINI_API_KEY or GOOGLE_API_KEY, "
                             "or run with --brain rules (needs no model)")


def test_bad_task_or_target_fails_before_anything_starts(tmp_path: Path) -> None:
    from jaxbench.task import TaskError
    from maxkernel.targets.names import TargetError

    with pytest.raises(TaskError, match="^no_such_task: no such suite task or task folder$"):
        optimize("no_such_task", data_dir=str(tmp_path))
    with pytest.raises(TargetError, match="^unknown target 'tpu-v9'"):
        optimize(TASK, target="tpu-v9", data_dir=str(tmp_path))
    assert not (tmp_path / "maxkernel.db").exists()  # no store was opened, no session row left behind
