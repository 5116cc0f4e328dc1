"""Timing helpers shared by the judge (reference side) and the workers (candidate side)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
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
# What separates this reading from a re-reading of the same kernel by fresh workers, beyond the rounds' own
# noise. Measured by ``benchmarks/interval_coverage.py`` (20 cpu tasks x 5 re-readings, idle 2-core host;
# docs/evaluator.md): fresh workers differ about as much as one run's rounds do (``WORKER_VS_ROUNDS``, a ratio
# of standard deviations), plus a floor for kernels whose rounds are steady but whose workers are not
# (``WORKER_FLOOR``, a standard deviation of the log speedup).
WORKER_VS_ROUNDS = 1.0
WORKER_FLOOR = 0.03


def speedup_interval(ref_ms: Sequence[float], cand_ms: Sequence[float], level: float = CI_LEVEL,
                     resamples: int = CI_RESAMPLES) -> tuple[float, float]:
    """Where a re-measurement of the same kernel in fresh workers reads, at ``level``: a prediction interval
    around this run's speedup (the ratio of medians), so a claim holds when someone measures it again.

    The rounds' own noise comes from a bootstrap: rounds are resampled in pairs, since both sides of a round
    ran on the same inputs one after the other, so what disturbed one side of a round likely disturbed the
    other; the generator's seed is fixed, so the same timings always give the same interval. A re-reading
    carries that noise twice (its own and this one's) and two workers' offsets (``WORKER_VS_ROUNDS``,
    ``WORKER_FLOOR``); on a log scale these add as independent errors, each side of the interval on its own.
    """
    ref, cand = np.asarray(ref_ms, dtype=np.float64), np.asarray(cand_ms, dtype=np.float64)
    if ref.size == 0 or ref.size != cand.size:
        raise ValueError(f"paired rounds needed: {ref.size} reference vs {cand.size} candidate timings")
    picks = np.random.default_rng(0).integers(0, ref.size, size=(resamples, ref.size))
    ratios = np.median(ref[picks], axis=1) / np.maximum(np.median(cand[picks], axis=1), 1e-12)
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(ratios, [tail, 1.0 - tail])
    point = float(np.median(ref) / max(float(np.median(cand)), 1e-12))
    z = NormalDist().inv_cdf(1.0 - tail)
    rounds = 2.0 * (1.0 + WORKER_VS_ROUNDS ** 2)  # two readings' rounds and two workers scaled to them
    floor = 2.0 * (z * WORKER_FLOOR) ** 2

    def side(end: float) -> float:
        half = abs(math.log(max(end, 1e-12) / point))
        return math.sqrt(rounds * half ** 2 + floor)

    return point * math.exp(-side(float(low))), point * math.exp(side(float(high)))
