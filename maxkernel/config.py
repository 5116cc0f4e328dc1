"""Settings: config/default.yaml, then a user file (MAXKERNEL_CONFIG), then MAXKERNEL_* variables.

Every command reads them the same way, so a value is honoured everywhere or refused everywhere: a value
of the wrong type or range, or a ``MAXKERNEL_*`` variable that names no setting (a typo would otherwise
be silently ignored), is a ``ConfigError`` whose one line names the variable or file it came from.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import yaml
from platformdirs import user_data_dir
from pydantic import BaseModel, ConfigDict, Field, ValidationError

CONFIG_DIR = Path(__file__).resolve().parent.parent / "config"
DEFAULTS_FILE = CONFIG_DIR / "default.yaml"
ENV_PREFIX = "MAXKERNEL_"
# Variables that are no setting of their own but are read where they matter.
OTHER_VARIABLES = {
    "MAXKERNEL_CONFIG": "a YAML file of settings",
    "MAXKERNEL_LEARNED_COST_MODEL": "off disables the learned cost model",
    "MAXKERNEL_NO_TPU_COMPILER": "any value prices references by the fallback model, not XLA:TPU's program",
    "MAXKERNEL_TPU_COMPILE": "1 also compiles TPU candidates with XLA:TPU and Mosaic (needs the tpu-compiler extra)",
    "MAXKERNEL_TEST_PG_URL": "the test suite's PostgreSQL server",
    "MAXKERNEL_TEST_PG_DIR": "the folder of that server",
}


class ConfigError(Exception):
    """A settings file or variable that cannot be used."""


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    data_dir: str = ""
    cache_dir: str = ""  # caches several processes may share (learned cost model, compiled programs)
    store_url: str = ""
    chroma_url: str = ""
    embedding: str = "structural"
    eval_workers: int = Field(1, ge=1)
    eval_timeout_s: float = Field(120.0, gt=0)
    eval_memory_gb: float = Field(8.0, gt=0)
    eval_correctness_seeds: int = Field(3, ge=1)
    eval_timing_rounds: int = Field(10, ge=1)
    default_target: str = "cpu"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    token: str = ""  # required by servers bound beyond loopback (the gRPC host), presented by their clients

    @property
    def data_path(self) -> Path:
        """``data_dir`` (``MAXKERNEL_DATA_DIR``) when set, else the platform's user data folder."""
        path = Path(self.data_dir).expanduser() if self.data_dir else Path(user_data_dir("maxkernel"))
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"data folder {path}: cannot be created ({exc.strerror})") from exc
        return path

    @property
    def cache_path(self) -> Path:
        """``cache_dir`` when set (a fleet's daemons share one), else the data folder."""
        if not self.cache_dir:
            return self.data_path
        path = Path(self.cache_dir).expanduser()
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"cache folder {path}: cannot be created ({exc.strerror})") from exc
        return path

    @property
    def resolved_store_url(self) -> str:
        return self.store_url or f"sqlite:///{self.data_path / 'maxkernel.db'}"

    @property
    def chroma_path(self) -> Path:
        return self.data_path / "chroma"


def env_name(field: str) -> str:
    return f"{ENV_PREFIX}{field.upper()}"


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(f"{path}:{where} not valid YAML ({getattr(exc, 'problem', None) or exc})") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of settings")
    return data


def check_environment(environ: dict[str, str] | None = None) -> None:
    """Refuse a ``MAXKERNEL_*`` variable that no part of MaxKernel reads."""
    environ = dict(os.environ if environ is None else environ)
    known = {env_name(f) for f in Settings.model_fields} | set(OTHER_VARIABLES)
    unknown = sorted(k for k in environ if k.startswith(ENV_PREFIX) and k not in known)
    if unknown:
        raise ConfigError(f"unknown variable {unknown[0]}: the known ones are {', '.join(sorted(known))}")


def load_settings(**overrides: Any) -> Settings:
    check_environment()
    values: dict[str, Any] = _read_yaml(DEFAULTS_FILE) if DEFAULTS_FILE.is_file() else {}
    source: dict[str, str] = {k: str(DEFAULTS_FILE) for k in values}
    user_file = os.environ.get("MAXKERNEL_CONFIG")
    if user_file:
        user_values = _read_yaml(Path(user_file))
        values.update(user_values)
        source |= {k: user_file for k in user_values}
    for name in Settings.model_fields:
        env = os.environ.get(env_name(name))
        if env is not None:
            values[name] = env
            source[name] = env_name(name)
    given = {k: v for k, v in overrides.items() if v is not None}
    values.update(given)
    source |= {k: "the caller" for k in given}
    try:
        return Settings.model_validate(values)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else ""
        origin = source.get(field, "settings")
        shown = f"{origin}={values[field]!r}" if origin == env_name(field) else f"{field}={values.get(field)!r} in {origin}"
        if first["type"] == "extra_forbidden":
            raise ConfigError(f"{origin}: unknown setting {field!r}; known: {', '.join(Settings.model_fields)}") from exc
        raise ConfigError(f"{shown}: {first['msg']}") from exc


@lru_cache(maxsize=1)
def settings() -> Settings:
    """The process-wide settings (read once)."""
    return load_settings()
