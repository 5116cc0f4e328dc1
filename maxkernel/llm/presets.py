"""Model presets and the price table, read from config/models.yaml.

A preset names a provider (gemini, openai, replay), a model, and where to reach it; the price table turns
token counts into dollars so that a session can stop at its money budget.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from maxkernel.config import CONFIG_DIR
from maxkernel.llm.errors import UnknownPresetError

MODELS_FILE = CONFIG_DIR / "models.yaml"

Provider = Literal["gemini", "openai", "replay"]


class Price(BaseModel):
    """US dollars per million tokens."""

    input: float = 0.0
    output: float = 0.0

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (prompt_tokens * self.input + completion_tokens * self.output) / 1e6


class ModelPreset(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = ""
    provider: Provider
    model: str
    base_url: str | None = None
    api_key_env: list[str] = Field(default_factory=list, description="variables tried in order for the key")
    family: str = "unknown"
    function_calling: bool = True
    timeout_s: float = 120.0
    max_retries: int = 4
    temperature: float | None = 0.2
    max_output_tokens: int | None = 8192


class ModelsFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    default: str
    presets: dict[str, ModelPreset]
    prices: dict[str, Price] = Field(default_factory=dict)

    def preset(self, name: str) -> ModelPreset:
        if name not in self.presets:
            known = ", ".join(sorted(self.presets))
            raise UnknownPresetError(f"no model preset {name!r} in {MODELS_FILE} (known: {known})")
        return self.presets[name].model_copy(update={"name": name})

    def price(self, model: str) -> Price:
        return self.prices.get(model, Price())


def read_models(path: Path = MODELS_FILE) -> ModelsFile:
    try:
        data = yaml.safe_load(path.read_text()) or {}
        return ModelsFile.model_validate(data)
    except (OSError, yaml.YAMLError, ValueError) as exc:
        raise UnknownPresetError(f"{path}: {exc}") from exc


@lru_cache(maxsize=1)
def models() -> ModelsFile:
    return read_models()
