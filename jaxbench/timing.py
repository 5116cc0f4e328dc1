"""Timing helpers shared by the judge (reference side) and the workers (candidate side)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np


def scaled(inputs: Sequence[Any], scale: float) -> list[np.ndarray]:
    """Fresh copies of ``inputs`` with float arrays multiplied by ``scale``.

    Each timing round uses new values, so a candidate that memoizes by identity or content gains
    nothing; both sides of a round get the same values.
    """
    out = []
    for a in inputs:
        a = np.asarray(a)
        if a.dtype.kind == "f" or a.dtype.name == "bfloat16":
            a = (a.astype(np.float32) * np.float32(scale)).astype(a.dtype)
        else:
            a = a.copy()
        out.append(a)
    return out


def round_scale(round_index: int) -> float:
    return 1.0 + (round_index + 1) / 512.0


@dataclass
class Stats:
    median_ms: float
    cv: float
    samples: list[float]


def stats(samples: Sequence[float]) -> Stats:
    arr = np.asarray(samples, dtype=np.float64)
    mean = float(arr.mean())
    return Stats(float(np.median(arr)), float(arr.std() / mean) if mean > 0 else 0.0, [float(s) for s in arr])
