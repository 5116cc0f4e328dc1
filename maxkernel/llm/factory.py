"""Build the client an LLM actor talks through: provider client, then retry, record and meter layers."""

from __future__ import annotations

import os
from pathlib import Path

from autogen_core.models import ChatCompletionClient

from maxkernel.llm.errors import MissingApiKeyError, TranscriptError
from maxkernel.llm.meter import Ledger, MeteredClient
from maxkernel.llm.presets import ModelPreset, models
from maxkernel.llm.retry import RetryingClient
from maxkernel.llm.transcript import RecordingClient, replay_client


def api_key(preset: ModelPreset) -> str:
    """The first set variable of the preset's ``api_key_env``; local servers without one get a placeholder."""
    if not preset.api_key_env:
        return "not-needed"
    for name in preset.api_key_env:
        value = os.environ.get(name, "").strip()
        if value:
            return value
    raise MissingApiKeyError(preset.name or preset.provider, tuple(preset.api_key_env))


def provider_client(preset: ModelPreset, actor: str, transcript: Path | None = None) -> ChatCompletionClient:
    """The bare client for a preset (no retry, meter or recording)."""
    if preset.provider == "replay":
        if transcript is None:
            raise TranscriptError("replay: no transcript file given (--transcript PATH); or run with --brain rules")
        return replay_client(transcript, actor)
    key = api_key(preset)
    if preset.provider == "gemini":
        from maxkernel.llm.gemini import GeminiChatCompletionClient

        return GeminiChatCompletionClient(preset.model, key, base_url=preset.base_url, temperature=preset.temperature,
                                          max_output_tokens=preset.max_output_tokens, timeout_s=preset.timeout_s,
                                          family=preset.family, function_calling=preset.function_calling)
    from maxkernel.llm.openai_compat import openai_compatible_client

    return openai_compatible_client(preset.model, preset.base_url, key, family=preset.family,
                                    function_calling=preset.function_calling, timeout_s=preset.timeout_s,
                                    temperature=preset.temperature, max_tokens=preset.max_output_tokens)


def make_client(preset: ModelPreset, actor: str, ledger: Ledger, *, transcript: Path | None = None,
                record_to: Path | None = None, base_delay_s: float = 1.0) -> ChatCompletionClient:
    client: ChatCompletionClient = provider_client(preset, actor, transcript)
    if preset.provider != "replay":
        client = RetryingClient(client, max_retries=preset.max_retries, base_delay_s=base_delay_s)
    if record_to is not None:
        client = RecordingClient(client, record_to, actor, preset.model)
    return MeteredClient(client, ledger, actor, preset.model, models().price(preset.model))
