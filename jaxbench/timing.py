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


CI_LEVEL = 0.95
CI_RESAMPLES = 2000


def speedup_interval(ref_ms: Sequence[float], cand_ms: Sequence[float], level: float = CI_LEVEL,
                     resamples: int = CI_RESAMPLES) -> tuple[float, float]:
    """A bootstrap confidence interval of the speedup (ratio of medians) over the interleaved rounds.

    Rounds are resampled in pairs: both sides of a round ran on the same inputs one after the other, so
    what disturbed one side of a round likely disturbed the other. The generator's seed is fixed, so the
    same timings always give the same interval.
    """
    ref, cand = np.asarray(ref_ms, dtype=np.float64), np.asarray(cand_ms, dtype=np.float64)
    if ref.size == 0 or ref.size != cand.size:
        raise ValueError(f"paired rounds needed: {ref.size} reference vs {cand.size} candidate timings")
    picks = np.random.default_rng(0).integers(0, ref.size, size=(resamples, ref.size))
    ratios = np.median(ref[picks], axis=1) / np.maximum(np.median(cand[picks], axis=1), 1e-12)
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(ratios, [tail, 1.0 - tail])
    return float(low), float(high)
