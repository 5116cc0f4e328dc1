"""Drawing tasks from the grammar by the committed mix: the same seed always gives the same tasks."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from jaxbench.generate.draft import Draft
from jaxbench.generate.families import FAMILIES

MIX_FILE = Path(__file__).with_name("mix.yaml")


class FamilyMix(BaseModel):
    model_config = ConfigDict(extra="forbid")
    weight: float = Field(gt=0)
    decode: Literal["never", "optional", "always"]


class Mix(BaseModel):
    """The content of ``mix.yaml``."""

    model_config = ConfigDict(extra="forbid")
    per: int = Field(gt=0)
    min_per_family: int = Field(ge=0)
    min_bf16_share: float = Field(ge=0, le=1)
    min_decode_share: float = Field(ge=0, le=1)
    bf16_probability: float = Field(ge=0, le=1)
    decode_probability: float = Field(ge=0, le=1)
    families: dict[str, FamilyMix]

    def minimum(self, count: int) -> int:
        """Draws every family gets among ``count``."""
        return self.min_per_family * count // self.per

    def quotas(self, count: int) -> tuple[int, int]:
        """(bfloat16 draws, decode-shaped draws) at least, among ``count``."""
        return math.ceil(self.min_bf16_share * count), math.ceil(self.min_decode_share * count)


def load_mix(path: Path = MIX_FILE) -> Mix:
    mix = Mix.model_validate(yaml.safe_load(path.read_text()))
    unknown = sorted(set(mix.families) - set(FAMILIES))
    if unknown:
        raise ValueError(f"{path}: families {unknown} are not in the grammar")
    return mix


class Slot(BaseModel):
    """What one draw will be: its family, dtype and shape, and the seed of what varies inside the family."""

    index: int
    family: str
    dtype: Literal["float32", "bfloat16"]
    decode: bool
    seed: str


def plan(seed: int, count: int, mix: Mix | None = None) -> list[Slot]:
    """The ``count`` slots of ``seed``: family minimums first, the rest by weight, then the dtype and shape
    quotas, each filled at random among the slots that can take it."""
    mix = mix or load_mix()
    rng = random.Random(f"generality:{seed}")
    names = list(mix.families)
    chosen = [name for name in names for _ in range(mix.minimum(count))][:count]
    weights = [mix.families[name].weight for name in names]
    chosen += rng.choices(names, weights=weights, k=count - len(chosen))
    rng.shuffle(chosen)
    decode = [mix.families[f].decode == "always" or (mix.families[f].decode == "optional"
                                                   and rng.random() < mix.decode_probability) for f in chosen]
    bf16 = [rng.random() < mix.bf16_probability for _ in chosen]
    want_bf16, want_decode = mix.quotas(count)
    _fill(rng, bf16, want_bf16, [True] * count)
    _fill(rng, decode, want_decode, [mix.families[f].decode != "never" for f in chosen])
    return [Slot(index=i, family=f, dtype="bfloat16" if b else "float32", decode=d, seed=f"{seed}:{i}:{f}")
            for i, (f, b, d) in enumerate(zip(chosen, bf16, decode))]


def _fill(rng: random.Random, flags: list[bool], want: int, allowed: list[bool]) -> None:
    """Turn on random allowed flags until ``want`` are on (or none is left to turn on)."""
    off = [i for i, (f, ok) in enumerate(zip(flags, allowed)) if ok and not f]
    rng.shuffle(off)
    for i in off[: max(0, want - sum(flags))]:
        flags[i] = True


def draft_of(slot: Slot) -> Draft:
    """The task a slot stands for (deterministic in the slot)."""
    return FAMILIES[slot.family](random.Random(slot.seed), slot.dtype, slot.decode)


def task_id(seed: int, slot: Slot, draft: Draft) -> str:
    return f"g{seed}_{slot.index:02d}_{draft.name}"


def draw(seed: int, count: int, mix: Mix | None = None) -> list[tuple[Slot, Draft]]:
    return [(slot, draft_of(slot)) for slot in plan(seed, count, mix)]
