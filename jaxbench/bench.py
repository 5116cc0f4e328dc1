"""Reference timings of suite tasks, with XLA's cost analysis for throughput figures."""

from __future__ import annotations

from functools import partial

import jax
from pydantic import BaseModel

from jaxbench.task import Task
from jaxbench.task_check import median_ms


class BenchRow(BaseModel):
    task: str
    category: str
    size: str
    ms: float
    flops: float | None
    bytes: float | None

    @property
    def gflops(self) -> float | None:
        return self.flops / self.ms / 1e6 if self.flops else None

    @property
    def gbytes_s(self) -> float | None:
        return self.bytes / self.ms / 1e6 if self.bytes else None


def bench_task(task: Task, size: str = "cpu", repeats: int = 7) -> BenchRow:
    args, static = task.get_inputs(jax.random.key(0), size)
    compiled = jax.jit(partial(task.reference, **static)).lower(*args).compile()
    cost = compiled.cost_analysis()
    if isinstance(cost, list):
        cost = cost[0] if cost else {}
    cost = cost or {}
    ms = median_ms(compiled, args, repeats)
    return BenchRow(task=task.id, category=task.spec.category, size=size, ms=ms,
                    flops=cost.get("flops"), bytes=cost.get("bytes accessed"))
