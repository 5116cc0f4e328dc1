"""Target names: the one place that says which ``--target`` values exist and what they mean."""

from __future__ import annotations

from typing import Literal

TargetKind = Literal["cpu", "gpu", "tpu"]

GENERATIONS: tuple[str, ...] = ("v4", "v5e", "v5p", "v6e", "v7")
TARGETS: tuple[str, ...] = ("cpu", "gpu", *(f"tpu-{g}" for g in GENERATIONS))


class TargetError(ValueError):
    """A target name, target spec or candidate that the target machinery cannot use (one-line message)."""


def parse_target(name: str) -> tuple[TargetKind, str | None]:
    """``"tpu-v5e"`` -> ``("tpu", "v5e")``; ``"cpu"`` -> ``("cpu", None)``; anything else is a TargetError."""
    key = name.strip().lower()
    if key in ("cpu", "gpu"):
        return key, None  # type: ignore[return-value]
    if key.startswith("tpu-") and key[4:] in GENERATIONS:
        return "tpu", key[4:]
    raise TargetError(f"unknown target {name!r}: expected one of {', '.join(TARGETS)}")


def tpu_generation(name: str) -> str:
    """A TPU generation given as ``"v5e"`` or ``"tpu-v5e"``, checked against :data:`GENERATIONS`."""
    key = name.strip().lower()
    key = key[4:] if key.startswith("tpu-") else key
    if key not in GENERATIONS:
        raise TargetError(f"unknown TPU generation {name!r}: expected one of {', '.join(GENERATIONS)}")
    return key
