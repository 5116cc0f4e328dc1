"""Values of a kernel's scalar-prefetch operands at ``full`` size, so data-dependent index maps can be evaluated.

The task draws its inputs with ``jax.random.key(PREFETCH_SEED)``; the program is re-run under ``jax.jit``
with every pallas_call stubbed out, returning only the prefetch operands, so XLA drops everything else
(large tensors are never materialised unless the prefetch values are computed from them).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import core

from jaxbench.task import Task
from maxkernel.targets.interpret import evaluate, pallas_dependent_inputs
from maxkernel.targets.jaxpr_walk import PallasCall

PREFETCH_SEED = 0


def prefetch_values(closed: core.ClosedJaxpr, call: PallasCall, task: Task) -> list[np.ndarray] | None:
    """The scalar-prefetch operands of ``call`` (empty if it has none); None if they cannot be computed
    (the kernel sits in a loop, or its prefetch operands come from another kernel's output)."""
    count = call.eqn.params["grid_mapping"].num_index_operands
    if count == 0:
        return []
    if call.in_control_flow:
        return None
    flags = pallas_dependent_inputs(closed.jaxpr, call.eqn)
    if flags is None or any(flags[:count]):
        return None

    def program(key: jax.Array) -> list[Any]:
        args, _ = task.get_inputs(key, "full")
        captured: list[list[Any]] = []

        def on_pallas(eqn: core.JaxprEqn, invals: list[Any]) -> list[Any]:
            if eqn is call.eqn and not captured:
                captured.append(invals[:count])
            return [jnp.zeros(v.aval.shape, v.aval.dtype) for v in eqn.outvars]

        evaluate(closed.jaxpr, closed.consts, list(args), {"pallas_call": on_pallas})
        return captured[0]

    return [np.asarray(v) for v in jax.jit(program)(jax.random.key(PREFETCH_SEED))]
