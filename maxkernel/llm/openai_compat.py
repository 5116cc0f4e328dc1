"""Any OpenAI-compatible server (OpenAI, vLLM, Ollama, LM Studio) through autogen-ext's client."""

from __future__ import annotations

from autogen_core.models import ModelInfo
from autogen_ext.models.openai import OpenAIChatCompletionClient


def openai_compatible_client(model: str, base_url: str | None, api_key: str, *, family: str = "unknown",
                             function_calling: bool = True, timeout_s: float = 120.0,
                             temperature: float | None = 0.2, max_tokens: int | None = None) -> OpenAIChatCompletionClient:
    """Retries are ours (``RetryingClient``), so the SDK's own are off: one policy, visible in the logs."""
    info = ModelInfo(vision=False, function_calling=function_calling, json_output=True, family=family,
                     structured_output=False)
    kwargs: dict = {"model": model, "api_key": api_key, "model_info": info, "timeout": timeout_s, "max_retries": 0}
    if base_url:
        kwargs["base_url"] = base_url
    if temperature is not None:
        kwargs["temperature"] = temperature
    if max_tokens is not None:
        kwargs["max_tokens"] = max_tokens
    return OpenAIChatCompletionClient(**kwargs)
