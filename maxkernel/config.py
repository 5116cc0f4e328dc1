"""Settings: config/default.yaml, then a user file (MAXKERNEL_CONFIG), then MAXKERNEL_* variables."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml
from platformdirs import user_data_dir
from pydantic import BaseModel, ConfigDict

CONFIG_DIR = Path(__file__).resolve().parent.parent / "config"
DEFAULTS_FILE = CONFIG_DIR / "default.yaml"


class ConfigError(Exception):
    """A settings file or variable that cannot be used."""


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    data_dir: str = ""
    store_url: str = ""
    chroma_url: str = ""
    embedding: str = "structural"
    eval_workers: int = 1
    eval_timeout_s: float = 120.0
    eval_memory_gb: float = 8.0
    eval_correctness_seeds: int = 3
    eval_timing_rounds: int = 10
    default_target: str = "cpu"
    log_level: str = "info"
    token: str = ""  # required by servers bound beyond loopback (the gRPC host), presented by their clients

    @property
    def data_path(self) -> Path:
        path = Path(self.data_dir).expanduser() if self.data_dir else Path(user_data_dir("maxkernel"))
        path.mkdir(parents=True, exist_ok=True)
        return path

    @property
    def resolved_store_url(self) -> str:
        return self.store_url or f"sqlite:///{self.data_path / 'maxkernel.db'}"

    @property
    def chroma_path(self) -> Path:
        return self.data_path / "chroma"


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping")
    return data


def load_settings(**overrides: Any) -> Settings:
    values: dict[str, Any] = _read_yaml(DEFAULTS_FILE) if DEFAULTS_FILE.is_file() else {}
    user_file = os.environ.get("MAXKERNEL_CONFIG")
    if user_file:
        values.update(_read_yaml(Path(user_file)))
    for name in Settings.model_fields:
        env = os.environ.get(f"MAXKERNEL_{name.upper()}")
        if env is not None:
            values[name] = env
    values.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return Settings.model_validate(values)
    except Exception as exc:
        raise ConfigError(f"invalid settings: {exc}") from exc


@lru_cache(maxsize=1)
def settings() -> Settings:
    """The process-wide settings (read once)."""
    return load_settings()
