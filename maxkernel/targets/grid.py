"""Which grid steps the model looks at, and evaluating per-step scalar functions (index maps, ``pl.when``
predicates) at those steps in one vectorised call.

Pallas TPU runs the grid in row-major order, one step after another. Up to ``EXACT_STEPS`` steps every step is
evaluated; past that, ``SAMPLED_STEPS`` steps are drawn at random with a fixed seed and each stands for
``weight`` real steps. Step 0 is always evaluated on its own (it has no predecessor).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from maxkernel.targets.names import TargetError

EXACT_STEPS = 1 << 18
SAMPLED_STEPS = 1 << 15


@dataclass(frozen=True)
class GridSample:
    grid: tuple[int, ...]
    steps: int
    t: np.ndarray  # the steps >= 1 looked at, ascending
    weight: float  # real steps each entry of t stands for
    sampled: bool

    @classmethod
    def of(cls, grid: Sequence[Any], seed: int = 0) -> "GridSample":
        if not all(isinstance(g, (int, np.integer)) for g in grid):
            raise TargetError(f"pallas_call grid {tuple(grid)} has dynamic bounds; the model needs a static grid")
        shape = tuple(int(g) for g in grid)
        steps = max(1, math.prod(shape))
        if steps - 1 <= EXACT_STEPS:
            return cls(shape, steps, np.arange(1, steps, dtype=np.int64), 1.0, False)
        t = np.sort(np.random.default_rng(seed).integers(1, steps, size=SAMPLED_STEPS))
        return cls(shape, steps, t, (steps - 1) / SAMPLED_STEPS, True)

    def evaluate(self, fn: Callable[[list[Any], list[Any]], list[Any]], refs: Sequence[np.ndarray]
                 ) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
        """Run ``fn(grid_ids, refs) -> [scalar, ...]`` at step 0, at every ``t - 1`` and at every ``t``.

        Returns the outputs split as (at step 0, at t - 1, at t), each output flattened to one value per step.
        """
        n = len(self.t)
        points = np.concatenate([[0], self.t - 1, self.t])
        if self.grid:
            ids = [np.asarray(c, dtype=np.int32) for c in np.unravel_index(points, self.grid)]
        else:
            ids = []
        in_axes = ([0] * len(ids), [None] * len(refs))
        outs = jax.jit(jax.vmap(fn, in_axes=in_axes, axis_size=len(points)))(ids, list(refs))
        flat = [np.broadcast_to(np.asarray(o).reshape(len(points), -1)[:, 0], (len(points),)) for o in outs]
        return [f[:1] for f in flat], [f[1:1 + n] for f in flat], [f[1 + n:] for f in flat]
