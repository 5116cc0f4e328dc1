"""Search strategy: the order in which configurations are measured (seeded, reproducible).

Configurations are sorted by the cost model's estimate; ties are broken by a seeded shuffle, so two runs
with one seed try the same configurations in the same order.
"""

from __future__ import annotations

import random

from maxkernel.tuning.cost_model import estimate
from maxkernel.tuning.space import Config


def order(configs: list[Config], extents: dict[str, int], target: str, seed: int) -> list[Config]:
    rng = random.Random(seed)
    keyed = [(estimate(c, extents, target), rng.random(), i) for i, c in enumerate(configs)]
    keyed.sort()
    first = configs[0] if configs else None
    ordered = [configs[i] for _, _, i in keyed]
    if first is not None:  # the template's own default is always measured first
        ordered.remove(first)
        ordered.insert(0, first)
    return ordered
