"""Learned cost model (MetaSchedule style): task structure + strategy + parameters -> predicted speedup.

Gradient-boosted trees (scikit-learn's ``HistGradientBoostingRegressor``) learn, from every configuration
the store has measured, how much faster a configuration runs than the typical configuration of the same
strategy on the same task (log speedup minus its group's mean). That relative figure is what ordering
needs: a task's absolute speedup does not change which of its block sizes is best. The model only orders
trials; the evaluator (``cpu``) or the TPU cost model (``tpu-*``) still judges each one.

A model is trained per target, cached in the data dir with the store size it was trained at, and trained
again once the store has grown by ``RETRAIN_EVERY`` measurements. Too little data gives no model, and
callers fall back to the hand-written order of ``maxkernel.tuning.strategy``.
``MAXKERNEL_LEARNED_COST_MODEL=off`` turns it off (the memory benchmark's ``--no-cost-model``).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import pickle
import secrets
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import structlog
from pydantic import BaseModel, Field

from maxkernel.analysis.signature import TaskSignature
from maxkernel.tuning.cost_model import grid_steps
from maxkernel.tuning.space import Config

log = structlog.get_logger("maxkernel.tuning.learned")

ENV_SWITCH = "MAXKERNEL_LEARNED_COST_MODEL"
RETRAIN_EVERY = 10
MIN_SAMPLES = 8
MIN_GROUPS = 2
FAILED_SPEEDUP = 0.1  # a configuration that failed counts as 10x slower than the reference
PARAM_SLOTS = 4
STRATEGY_CODES = 64
TRANSCENDENTAL = frozenset({"exp", "log", "tanh", "logistic", "erf", "erfc", "erf_inv", "rsqrt", "sqrt", "pow"})
COUNTED = ("dot_general", "conv_general_dilated", "ragged_dot_general", "reduce_sum", "reduce_max",
           "scan", "while", "gather", "scatter-add", "cumsum")
TASK_FEATURES = ("n_primitives", "transcendental", *(f"n_{p}" for p in COUNTED), "log_in_max", "log_in_total",
                 "log_out_max", "rank_in", "rank_out", "n_inputs", "out_bytes")
CONFIG_FEATURES = ("log_steps", "n_blocked", "log_block_min", "log_block_max", "log_block_prod",
                   *(f"slot{i}_log" for i in range(PARAM_SLOTS)), *(f"slot{i}_frac" for i in range(PARAM_SLOTS)))
CATEGORICAL = ("category", "strategy", "kind")
FEATURES = (*TASK_FEATURES, *CONFIG_FEATURES, *CATEGORICAL)


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "on").strip().lower() not in ("0", "off", "false", "no")


def _code(text: str, buckets: int) -> int:
    """A stable small integer for a name (Python's ``hash`` changes between processes)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=4).digest(), "little") % buckets


def _log2(x: float) -> float:
    return math.log2(x) if x > 0 else 0.0


def task_features(signature: TaskSignature) -> dict[str, float]:
    """Numbers that describe what a reference computes and how big it is."""
    prims = signature.primitives
    sizes_in = [math.prod(s.shape) for s in signature.inputs] or [1]
    sizes_out = [math.prod(s.shape) for s in signature.outputs] or [1]
    dtype = signature.outputs[0].dtype if signature.outputs else "float32"
    out_bytes = 2.0 if "16" in dtype else 1.0 if "8" in dtype else 8.0 if "64" in dtype else 4.0
    feats: dict[str, float] = {
        "n_primitives": math.log1p(len(prims)),
        "transcendental": float(sum(p in TRANSCENDENTAL for p in prims)),
        "log_in_max": _log2(max(sizes_in)),
        "log_in_total": _log2(sum(sizes_in)),
        "log_out_max": _log2(max(sizes_out)),
        "rank_in": float(max((len(s.shape) for s in signature.inputs), default=0)),
        "rank_out": float(max((len(s.shape) for s in signature.outputs), default=0)),
        "n_inputs": float(len(signature.inputs)),
        "out_bytes": out_bytes,
        "category": float(_code(signature.category or "", 32)),
    }
    for prim in COUNTED:
        feats[f"n_{prim}"] = float(prims.count(prim))
    return feats


def config_features(strategy: str, kind: str, params: Config, extents: dict[str, int]) -> dict[str, float]:
    """Numbers that describe one configuration: its grid, its block sizes, and which strategy it is."""
    blocks = {k: v for k, v in params.items() if isinstance(v, int) and not isinstance(v, bool) and v > 0}
    feats: dict[str, float] = {
        "log_steps": _log2(grid_steps(params, extents)),
        "n_blocked": float(sum(1 for k in blocks if k in extents)),
        "log_block_min": _log2(min(blocks.values(), default=0)),
        "log_block_max": _log2(max(blocks.values(), default=0)),
        "log_block_prod": sum(_log2(v) for v in blocks.values()),
        "strategy": float(_code(strategy.split(":", 1)[-1], STRATEGY_CODES)),
        "kind": float(_code(kind, 8)),
    }
    for i in range(PARAM_SLOTS):
        feats[f"slot{i}_log"] = feats[f"slot{i}_frac"] = 0.0
    for name in sorted(params):
        value = params[name]
        slot = _code(name, PARAM_SLOTS)
        if name in blocks:
            feats[f"slot{slot}_log"] += _log2(blocks[name])
            if extents.get(name):
                feats[f"slot{slot}_frac"] += _log2(blocks[name] / extents[name])
        elif isinstance(value, (bool, str)):
            feats[f"slot{slot}_log"] += float(_code(str(value), 16))
    return feats


class Sample(BaseModel):
    """One measured configuration, as the model sees it; ``speedup`` None means it failed."""

    task: dict[str, float]
    strategy: str
    kind: str = ""
    params: dict[str, Any] = Field(default_factory=dict)
    extents: dict[str, int] = Field(default_factory=dict)
    speedup: float | None = None
    group: str = Field(description="task and strategy: the configurations compared with each other")


def _row(task: dict[str, float], strategy: str, kind: str, params: Config, extents: dict[str, int]) -> list[float]:
    feats = {**task, **config_features(strategy, kind, params, extents)}
    return [float(feats.get(name, 0.0)) for name in FEATURES]


def training_set(samples: Sequence[Sample]) -> tuple[np.ndarray, np.ndarray]:
    """Features and relative log speedups of the groups with at least two configurations."""
    groups: dict[str, list[Sample]] = defaultdict(list)
    for sample in samples:
        groups[sample.group].append(sample)
    rows: list[list[float]] = []
    ys: list[float] = []
    for group in groups.values():
        if len(group) < 2:
            continue
        logs = [math.log(max(s.speedup, FAILED_SPEEDUP)) if s.speedup else math.log(FAILED_SPEEDUP) for s in group]
        mean = sum(logs) / len(logs)
        for sample, value in zip(group, logs):
            rows.append(_row(sample.task, sample.strategy, sample.kind, sample.params, sample.extents))
            ys.append(value - mean)
    return np.asarray(rows, dtype=np.float64).reshape(-1, len(FEATURES)), np.asarray(ys, dtype=np.float64)


class LearnedCostModel:
    """A fitted regressor and what it was trained on."""

    def __init__(self, regressor: Any, samples: int, groups: int, strategies: frozenset[str] = frozenset()) -> None:
        self.regressor, self.samples, self.groups = regressor, samples, groups
        self.strategies = strategies  # the strategies it has seen measured

    def knows(self, strategy: str) -> bool:
        """Whether ``strategy`` was among what it learned from (a model cached before this was kept: no)."""
        return strategy in getattr(self, "strategies", frozenset())

    @classmethod
    def fit(cls, samples: Sequence[Sample]) -> LearnedCostModel | None:
        """Train on ``samples``; None when there is too little to learn from (fewer than ``MIN_SAMPLES``
        configurations in groups of two or more, or fewer than ``MIN_GROUPS`` groups)."""
        from sklearn.ensemble import HistGradientBoostingRegressor
        from threadpoolctl import threadpool_limits

        x, y = training_set(samples)
        sizes = Counter(s.group for s in samples)
        groups = sum(1 for n in sizes.values() if n >= 2)
        if len(y) < MIN_SAMPLES or groups < MIN_GROUPS:
            return None
        regressor = HistGradientBoostingRegressor(
            max_iter=150, learning_rate=0.1, max_depth=4, min_samples_leaf=3, l2_regularization=0.1,
            categorical_features=[FEATURES.index(c) for c in CATEGORICAL], early_stopping=False, random_state=0)
        with threadpool_limits(1):  # a few hundred rows: threads only contend with the evaluator's workers
            regressor.fit(x, y)
        return cls(regressor, len(y), groups, frozenset(s.strategy for s in samples))

    def predict(self, task: dict[str, float], strategy: str, kind: str, configs: Sequence[Config],
                extents: dict[str, int]) -> list[float]:
        """Predicted speedup of each configuration over the strategy's typical one (1.0 = typical)."""
        if not configs:
            return []
        from threadpoolctl import threadpool_limits

        x = np.asarray([_row(task, strategy, kind, c, extents) for c in configs], dtype=np.float64)
        with threadpool_limits(1):
            predicted = self.regressor.predict(x)
        return [float(math.exp(v)) for v in predicted]

    def order(self, task: dict[str, float], strategy: str, kind: str, configs: Sequence[Config],
              extents: dict[str, int]) -> list[Config]:
        """``configs`` fastest-predicted first (ties keep their given order)."""
        scores = self.predict(task, strategy, kind, configs, extents)
        ranked = sorted(range(len(configs)), key=lambda i: (-scores[i], i))
        return [configs[i] for i in ranked]


def model_path(cache_dir: Path, target: str) -> Path:
    return cache_dir / "cost_model" / f"learned-{target}.pkl"


def _write_atomically(path: Path, data: bytes) -> None:
    """Write ``path`` whole or not at all: processes that share the cache read either the old file or the new."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        tmp.write_bytes(data)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def cached_model(path: Path, store_size: int, samples: Callable[[], Sequence[Sample]],
                 retrain_every: int = RETRAIN_EVERY) -> LearnedCostModel | None:
    """The model cached at ``path`` while the store has grown by less than ``retrain_every`` since it was
    trained; otherwise one trained now on ``samples()`` and cached (a store too small to learn from is
    remembered too, so it is not read again until it grows)."""
    meta_path = path.with_suffix(".json")
    if meta_path.exists():
        try:
            meta = json.loads(meta_path.read_text())
            if 0 <= store_size - int(meta["store_size"]) < retrain_every:
                if not meta.get("trained"):
                    return None
                with path.open("rb") as fh:
                    model = pickle.load(fh)
                if isinstance(model, LearnedCostModel):
                    return model
        except (OSError, ValueError, KeyError, pickle.UnpicklingError, EOFError, AttributeError) as exc:
            log.warning("learned.cache_unreadable", path=str(path), error=str(exc))
    model = LearnedCostModel.fit(samples())
    path.parent.mkdir(parents=True, exist_ok=True)
    if model is not None:
        _write_atomically(path, pickle.dumps(model))
    _write_atomically(meta_path, json.dumps({"store_size": store_size, "trained": model is not None, "samples":
                                             model.samples if model else 0, "groups": model.groups if model else 0}).encode())
    log.info("learned.trained", path=str(path), store_size=store_size, trained=model is not None,
             samples=model.samples if model else 0)
    return model
