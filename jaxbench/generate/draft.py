"""One drawn task before it is written: its source, sizes and the facts the mix is checked against."""

from __future__ import annotations

import random
import textwrap
from dataclasses import dataclass, field
from typing import Any

JNP_DTYPE = {"float32": "jnp.float32", "bfloat16": "jnp.bfloat16"}


@dataclass
class Draft:
    """A generated task: ``source`` is the whole ``reference.py``; ``sizes`` holds ``cpu`` and ``full``."""

    family: str
    name: str
    category: str
    description: str
    dtype: str
    decode: bool
    source: str
    sizes: dict[str, dict[str, int]]
    free: dict[str, dict[str, int]] = field(default_factory=dict)
    blocks: list[str] = field(default_factory=list)  # the grammar's building blocks this draw is made of

    def spec(self, task_id: str, atol: float, rtol: float) -> dict[str, Any]:
        """The ``task.yaml`` content under ``task_id``."""
        return {"id": task_id, "name": self.name, "category": self.category,
                "description": " ".join(self.description.split()), "dtype": self.dtype,
                "tolerance": {"atol": atol, "rtol": rtol}, "sizes": self.sizes, "free": self.free}


class Namer:
    """Picks one spelling per role from a pool, so that two draws of a family rarely read alike."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.used: set[str] = set()

    def pick(self, *options: str) -> str:
        fresh = [o for o in options if o not in self.used] or list(options)
        choice = self.rng.choice(fresh)
        self.used.add(choice)
        return choice

    def flag(self, p: float = 0.5) -> bool:
        return self.rng.random() < p


def code(text: str) -> str:
    """Dedented source with one trailing newline."""
    return textwrap.dedent(text).strip("\n") + "\n"
