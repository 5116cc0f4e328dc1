"""Model clients for the LLM brain: Gemini (google-genai), OpenAI-compatible servers, replay, recording.

Every client is an AutoGen ``ChatCompletionClient``; ``make_client`` stacks retry, recording and the
budget meter on top of the provider's client. Exports load on first use, so that importing the error
types (the CLI does, for every command) does not load AutoGen.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "BudgetExceeded": "errors", "LlmError": "errors", "MissingApiKeyError": "errors",
    "TranscriptError": "errors", "UnknownPresetError": "errors",
    "api_key": "factory", "make_client": "factory", "provider_client": "factory",
    "Ledger": "meter", "MeteredClient": "meter",
    "ModelPreset": "presets", "Price": "presets", "models": "presets",
    "RetryingClient": "retry", "is_transient": "retry",
    "Exchange": "transcript", "RecordingClient": "transcript", "append_exchange": "transcript",
    "read_transcript": "transcript", "replay_client": "transcript",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"maxkernel.llm.{_EXPORTS[name]}"), name)
