"""Cheap estimate used to order configurations before anything is measured.

On the CPU target Pallas runs interpreted and every grid step costs a fixed overhead, so fewer, larger
blocks are estimated faster; on TPU the order is the same first guess (big blocks amortize the ~0.35 us
step overhead) and the evaluator's roofline model then ranks what was tried.
"""

from __future__ import annotations

import math

from maxkernel.tuning.space import Config


def grid_steps(config: Config, extents: dict[str, int]) -> float:
    """Estimated number of grid steps: the product of extent / block over the blocked parameters."""
    steps = 1.0
    for name, value in config.items():
        if name in extents and isinstance(value, int) and value > 0:
            steps *= max(1.0, extents[name] / value)
    return steps


def estimate(config: Config, extents: dict[str, int], target: str) -> float:
    """Lower is better. CPU: grid steps dominate; TPU: steps, with a mild preference for mid-size blocks."""
    steps = grid_steps(config, extents)
    if target.startswith("tpu"):
        return math.log2(steps + 1) + 0.1 * abs(math.log2(max(steps, 1.0)) - 3)
    return steps
