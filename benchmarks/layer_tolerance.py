"""How far each model layer's bf16 code lands from a float64 evaluation of the same math, on the inputs the
evaluator checks with (fresh seeds and the shifted set), with matmuls computed as on a CPU and as on a TPU.

A layer's tolerance must accept its own code under both numerics with room for a second, equally good bf16
implementation (the candidate), so it is set from ``need``: at rtol ``RTOL``, the smallest atol that accepts the
worst case here. ``python benchmarks/layer_tolerance.py [LAYER ...]`` prints a row per layer.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import numpy as np

from jaxbench.evaluate import shifted
from jaxbench.task import Task, list_models, load_task
from jaxbench.tpu_numerics import computed_as_on_tpu


RTOL = 2e-2  # a few bf16 ulps (2**-8 apart) of relative error on every element


def needed_atol(expected: Any, actual: Any, rtol: float = RTOL) -> float:
    """The smallest atol with |actual - expected| <= atol + rtol * |expected| everywhere (``compare_outputs``'
    rule): what rounding of intermediates larger than the element itself costs."""
    e = np.asarray(expected, np.float64)
    a = np.asarray(actual, np.float64)
    return float(max(0.0, np.max(np.abs(a - e) - rtol * np.abs(e))))


def input_sets(task: Task, seeds: tuple[int, ...], size: str = "cpu") -> list[list[np.ndarray]]:
    """The evaluator's kinds of input: one set per seed, and the shifted set of the first seed."""
    sets = [[np.asarray(a) for a in task.get_inputs(jax.random.key(s), size)[0]] for s in seeds]
    return sets + [shifted(sets[0])]


def layer_need(task: Task, seeds: tuple[int, ...] = (0, 1), size: str = "cpu") -> dict[str, float]:
    """Per numerics (``cpu``, ``tpu``), the atol (at ``RTOL``) the layer's own code needs against float64 over
    the input sets; ``cpu_vs_tpu`` is how far the two numerics are from each other, and ``seeds`` what the
    unshifted sets alone need (the shifted set's offset weights raise intermediates far above the output)."""
    _, static = task.get_inputs(jax.random.key(0), size)
    fn = partial(task.reference, **static)
    need = {"cpu": 0.0, "tpu": 0.0, "cpu_vs_tpu": 0.0, "seeds": 0.0}
    for i, inputs in enumerate(input_sets(task, seeds, size)):
        closed = jax.make_jaxpr(fn)(*inputs)
        on_tpu, _ = computed_as_on_tpu(fn, closed, inputs)
        cpu = np.asarray(jax.jit(fn)(*inputs))
        tpu = np.asarray(jax.jit(on_tpu)(*inputs))
        with jax.enable_x64(True):
            exact = np.asarray(jax.jit(fn)(*[np.asarray(a, np.float64) for a in inputs]))
        need["cpu"] = max(need["cpu"], needed_atol(exact, cpu))
        need["tpu"] = max(need["tpu"], needed_atol(exact, tpu))
        need["cpu_vs_tpu"] = max(need["cpu_vs_tpu"], needed_atol(cpu, tpu))
        if i < len(seeds):
            need["seeds"] = max(need["seeds"], needed_atol(exact, cpu), needed_atol(exact, tpu))
    return need


def main(argv: list[str]) -> int:
    from rich.console import Console
    from rich.table import Table

    ids = argv or [t.id for t in list_models()]
    table = Table("layer", "atol", "rtol", "need cpu", "need tpu", "cpu vs tpu", "need, seeds only")
    for layer_id in ids:
        task = load_task(layer_id)
        need = layer_need(task)
        tol = task.spec.tolerance
        table.add_row(layer_id, f"{tol.atol:g}", f"{tol.rtol:g}", *(f"{need[k]:.2e}" for k in ("cpu", "tpu", "cpu_vs_tpu", "seeds")))
    Console().print(table)
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
