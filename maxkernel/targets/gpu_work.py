"""The work of a GPU kernel body per grid cell, following loops whose trip count a small input decides.

A GPU kernel has no scalar prefetch: a decode kernel reads a sequence's length, a grouped matmul its group
bounds, from an ordinary input window (a few int32 elements) and loops that many times. To charge each
cell for the trips it really makes, the values of such small integer operands are computed from the
task's ``full`` inputs (drawn as :mod:`maxkernel.targets.prefetch` draws them), and at each grid cell the
control interpreter sees that cell's window of them: the operand sliced where the BlockSpec's index map
points. Every other operand stays unknown; without known operands this is :func:`step_work` itself.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import core

from jaxbench.task import Task
from maxkernel.targets.blocks import _block_dim
from maxkernel.targets.control import UNKNOWN, Interpreter, RefCell
from maxkernel.targets.grid import GridSample
from maxkernel.targets.interpret import evaluate, pallas_dependent_inputs
from maxkernel.targets.jaxpr_walk import PallasCall
from maxkernel.targets.ops import charges
from maxkernel.targets.prefetch import pricing_key
from maxkernel.targets.work import KERNEL_SMALL, StepWork, kernel_axes, step_work

SMALL_OPERAND = 1 << 16  # elements of an integer operand worth computing (page tables, lengths, group sizes)


def small_operands(closed: core.ClosedJaxpr, call: PallasCall, task: Task) -> dict[int, np.ndarray]:
    """Values of the call's small integer input operands at ``full`` size, by operand position; empty where
    none can be computed (the kernel sits in a loop, or they come from another kernel's output)."""
    grid_mapping = call.eqn.params["grid_mapping"]
    wanted = [i for i, v in enumerate(call.eqn.invars[: grid_mapping.num_inputs])
              if np.issubdtype(v.aval.dtype, np.integer) and int(np.prod(v.aval.shape)) <= SMALL_OPERAND]
    if not wanted or call.in_control_flow or grid_mapping.num_index_operands:
        return {}
    flags = pallas_dependent_inputs(closed.jaxpr, call.eqn)
    if flags is None or any(flags[i] for i in wanted):
        return {}

    def program(key: jax.Array) -> list[Any]:
        args, _ = task.get_inputs(key, "full")
        captured: list[list[Any]] = []

        def on_pallas(eqn: core.JaxprEqn, invals: list[Any]) -> list[Any]:
            if eqn is call.eqn and not captured:
                captured.append([invals[i] for i in wanted])
            return [jnp.zeros(v.aval.shape, v.aval.dtype) for v in eqn.outvars]

        evaluate(closed.jaxpr, closed.consts, list(args), {"pallas_call": on_pallas})
        return captured[0]

    values = jax.jit(program)(pricing_key())
    return {i: np.asarray(v) for i, v in zip(wanted, values)}


def _window(bm: Any, value: Any, ids: list[Any]) -> Any:
    """The block of ``value`` that ``bm``'s index map points at for grid indices ``ids`` (Blocked and
    squeezed dimensions; None for any other kind of block dimension)."""
    closed = bm.index_map_jaxpr
    index = core.eval_jaxpr(closed.jaxpr, closed.consts, *ids)
    starts, sizes = [], []
    for dim, at in zip(bm.block_shape, index):
        kind = type(dim).__name__
        if dim is None or kind == "Squeezed":
            starts.append(at)
            sizes.append(1)
        elif kind == "Blocked":
            starts.append(at * int(dim.block_size))
            sizes.append(int(dim.block_size))
        else:
            return None
    block = jax.lax.dynamic_slice(jnp.asarray(value), [jnp.asarray(s, jnp.int32) for s in starts], sizes)
    kept = [_block_dim(d) for d in bm.block_shape if not (d is None or type(d).__name__ == "Squeezed")]
    return block.reshape(kept)


def gpu_step_work(call: PallasCall, sample: GridSample, known: dict[int, np.ndarray]) -> StepWork:
    """The body's work at step 0 and the sampled steps, each known small operand's window visible per cell."""
    kernel = call.eqn.params["jaxpr"]
    grid_mapping = call.eqn.params["grid_mapping"]
    mappings = list(grid_mapping.block_mappings)
    usable = {i: v for i, v in known.items() if int(np.prod([_block_dim(d) for d in mappings[i].block_shape]))
              <= KERNEL_SMALL}
    if not usable:
        return step_work(kernel, grid_mapping, sample, None)
    axes, grid = kernel_axes(grid_mapping), sample.grid
    args = [RefCell(i) if i in usable else UNKNOWN for i in range(len(kernel.invars))]

    def at_point(point_ids: list[Any]) -> dict[Any, Any]:
        state = {}
        for i, value in usable.items():
            block = _window(mappings[i], value, point_ids)
            if block is not None:
                state[i] = block
        interp = Interpreter(point_ids, grid, axes, state, small=KERNEL_SMALL)
        interp.run(kernel, [], [a if not isinstance(a, RefCell) or a.key in state else UNKNOWN for a in args], ())
        return interp.records

    notes: list[str] = []
    points = np.concatenate([[0], sample.t])
    ids = [jnp.asarray(c, dtype=jnp.int32) for c in np.unravel_index(points, grid)] if grid else []
    try:
        records = jax.jit(jax.vmap(at_point))(ids) if ids else at_point([])
        found = {k: np.asarray(v) for k, v in records.items()}
    except Exception as exc:  # an exotic body: fall back to what step_work follows without the operands
        notes.append(f"small operands not followed ({type(exc).__name__})")
        return step_work(kernel, grid_mapping, sample, None)
    return StepWork(charges(kernel, found, 1.0), sample, notes)
