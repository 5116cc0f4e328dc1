"""Transcripts: every real model exchange saved as a JSON line, and replay clients fed from them.

A line is ``{"actor", "model", "messages", "result"}``; ``result`` is AutoGen's ``CreateResult``. Replay
hands each actor its own replies in recorded order, so a recorded session runs again exactly, without
a network or a key.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, AsyncGenerator, Sequence

from autogen_core.models import ChatCompletionClient, CreateResult, LLMMessage, ModelFamily, ModelInfo
from autogen_ext.models.replay import ReplayChatCompletionClient
from pydantic import BaseModel, TypeAdapter

from maxkernel.llm.delegate import DelegatingClient
from maxkernel.llm.errors import TranscriptError

_MESSAGES = TypeAdapter(list[LLMMessage])
_lock = threading.Lock()

REPLAY_INFO = ModelInfo(vision=False, function_calling=True, json_output=True, family=ModelFamily.UNKNOWN,
                        structured_output=False)


class Exchange(BaseModel):
    actor: str
    model: str = ""
    messages: list[dict[str, Any]] = []
    result: CreateResult


def append_exchange(path: Path, exchange: Exchange) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    line = exchange.model_dump_json()
    with _lock, path.open("a", encoding="utf-8") as fh:
        fh.write(line + "\n")


def read_transcript(path: Path) -> list[Exchange]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise TranscriptError(f"{path}: cannot read transcript: {exc}") from exc
    out = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append(Exchange.model_validate_json(line))
        except ValueError as exc:
            raise TranscriptError(f"{path}:{number}: not a transcript line: {str(exc).splitlines()[0]}") from exc
    return out


def replay_client(path: Path, actor: str) -> ReplayChatCompletionClient:
    """The replies recorded for ``actor``, in order."""
    results = [e.result for e in read_transcript(path) if e.actor == actor]
    return ReplayChatCompletionClient(results, model_info=REPLAY_INFO)


class RecordingClient(DelegatingClient):
    """Saves every exchange with the wrapped client to ``path`` (appending)."""

    def __init__(self, inner: ChatCompletionClient, path: Path, actor: str, model: str) -> None:
        super().__init__(inner)
        self.path, self.actor, self.model = Path(path), actor, model

    def _save(self, messages: Sequence[LLMMessage], result: CreateResult) -> None:
        dumped = _MESSAGES.dump_python(list(messages), mode="json")
        append_exchange(self.path, Exchange(actor=self.actor, model=self.model, messages=dumped, result=result))

    async def create(self, messages: Sequence[LLMMessage], **kwargs: Any) -> CreateResult:  # type: ignore[override]
        result = await self.inner.create(messages, **kwargs)
        self._save(messages, result)
        return result

    async def create_stream(self, messages: Sequence[LLMMessage], **kwargs: Any) -> AsyncGenerator[Any, None]:  # type: ignore[override]
        async for chunk in self.inner.create_stream(messages, **kwargs):
            if isinstance(chunk, CreateResult):
                self._save(messages, chunk)
            yield chunk
