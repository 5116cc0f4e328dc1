"""The tuned table: the best measured configuration of each strategy, keyed by (chip or cpu, shape class),
and the rule that turns a tuned block size into a legal one at any shape.

The table is read from memory's measurements (every judged draft and tuning trial in the event log):
parameter priors start the tuner from its entries, and ``maxkernel export`` writes the entries of the
exported kernel into its module, so what a session learned and what a user ships are one table. A shape
class is each tiled extent rounded to its power of two: configurations tuned at 2048 rows serve 1500 to
2900 rows first, and a shape no entry covers takes the nearest class.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, Protocol

from pydantic import BaseModel, Field

ANY_SHAPE = "any"


class MeasuredRow(Protocol):
    """What the table reads of one measurement (``memory.insights.Measurement`` has it)."""

    task_id: str
    target: str
    strategy: str
    params: dict[str, Any]
    extents: dict[str, int]
    space: dict[str, list[Any]]
    speedup: float | None

    @property
    def passed(self) -> bool: ...


def shape_class(extents: dict[str, int]) -> str:
    """``block_m~2048,block_n~512``: each extent at its nearest power of two; ``any`` without extents."""
    parts = [f"{name}~{2 ** round(math.log2(value))}" for name, value in sorted(extents.items()) if value > 0]
    return ",".join(parts) or ANY_SHAPE


class TunedEntry(BaseModel):
    """The best passing configuration of one strategy on one task, chip and shape class."""

    target: str = Field(description="cpu, tpu-v6e, gpu-h100 ...")
    shape_class: str
    strategy: str
    task_id: str
    params: dict[str, Any]
    extents: dict[str, int] = Field(default_factory=dict)
    space: dict[str, list[Any]] = Field(default_factory=dict)
    speedup: float = Field(description="the lower end of its measured (or modelled) speedup's interval")


class TunedTable(BaseModel):
    entries: list[TunedEntry] = Field(default_factory=list)

    @classmethod
    def from_rows(cls, rows: Iterable[MeasuredRow]) -> "TunedTable":
        """The best passing row per (task, target, strategy, shape class); rows without a speedup or that
        did not pass say nothing about what to run."""
        best: dict[tuple[str, str, str, str], TunedEntry] = {}
        for row in rows:
            if not row.passed or row.speedup is None:
                continue
            key = (row.task_id, row.target, row.strategy, shape_class(row.extents))
            if key not in best or row.speedup > best[key].speedup:
                best[key] = TunedEntry(target=row.target, shape_class=key[3], strategy=row.strategy,
                                       task_id=row.task_id, params=dict(row.params), extents=dict(row.extents),
                                       space=dict(row.space), speedup=float(row.speedup))
        return cls(entries=sorted(best.values(), key=lambda e: (e.target, e.strategy, e.shape_class, e.task_id)))

    def of(self, strategy: str, task_id: str | None = None) -> list[TunedEntry]:
        return [e for e in self.entries if e.strategy == strategy and (task_id is None or e.task_id == task_id)]

    def keyed(self, strategy: str, task_id: str) -> dict[tuple[str, str], dict[str, Any]]:
        """``{(target, shape class): params}`` of one kernel: what an exported module carries."""
        return {(e.target, e.shape_class): dict(e.params) for e in self.of(strategy, task_id)}


def lookup(table: dict[tuple[str, str], dict[str, Any]], target: str, extents: dict[str, int]) -> dict[str, Any] | None:
    """The entry for ``target`` whose shape class is nearest to ``extents`` (same class first), or None."""
    want = {name: math.log2(v) for name, v in extents.items() if v > 0}

    def distance(cls_text: str) -> float:
        if cls_text == ANY_SHAPE:
            return 0.0 if not want else 1e9
        have = dict(part.split("~") for part in cls_text.split(","))
        return sum(abs(math.log2(int(have[n])) - v) if n in have else 1e6 for n, v in want.items())

    options = [(distance(cls_text), cls_text) for (chip, cls_text) in table if chip == target]
    if not options:
        return None
    return dict(table[(target, min(options)[1])])


def block_for(extent: int, tuned: int, align: int = 1, smallest: int = 1, what: str = "extent") -> int:
    """The block for ``extent``: the largest divisor of it that is at most the tuned block, a multiple of
    ``align`` (the chip's tiling) and at least ``smallest`` (fewer, larger steps than that are what the
    kernel was tuned for); the whole extent when it is no larger than the tuned block. Any other extent is
    refused, naming what this kernel serves, rather than run with blocks it was never checked with."""
    if extent <= tuned and extent % align == 0 or extent == tuned:
        return extent
    for block in range(min(tuned, extent) // align * align, 0, -align):
        if block < smallest:
            break
        if extent % block == 0:
            return block
    raise ValueError(f"{what}={extent} is not served: this kernel needs {what} at most {tuned} and a multiple of "
                     f"{align}, or a multiple of a block between {max(smallest, align)} and {tuned} that is a "
                     f"multiple of {align}")
