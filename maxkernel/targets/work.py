"""The work of a kernel body, grid step by grid step.

The body's control part (``pl.when`` conditions at any depth, ``lax.cond``, ``fori_loop``/``while_loop`` trip
counts) is re-run at the model's grid steps by :class:`maxkernel.targets.control.Interpreter`, knowing the
grid indices and the scalar-prefetch values: a nested ``pl.when`` is charged only where every enclosing
condition holds, a loop over ``lengths[b] // block`` for the trips it makes at each step. When the grid is
walked in full, steps run in order and what the kernel writes into its scalar-prefetch refs (a "first
block" flag, a double-buffer index) is carried from one step to the next, as on the TPU.

Under ``jax.vmap`` of a ``pallas_call`` the grid gains leading axes the kernel does not see: its
``program_id(a)`` is the a-th grid axis that is not vmapped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax._src import core
from jax._src.state.types import AccumEffect, WriteEffect

from maxkernel.targets.control import UNKNOWN, Interpreter, Path, RefCell
from maxkernel.targets.grid import GridSample
from maxkernel.targets.ops import Charge, OpCounts, charges
from maxkernel.targets.specs import TpuSpec

KERNEL_SMALL = 128  # largest known value (elements) followed per grid step


@dataclass
class StepWork:
    parts: list[Charge]  # work of one run, and runs at step 0 then at each sampled step t
    sample: GridSample
    notes: list[str] = field(default_factory=list)

    def seconds(self, spec: TpuSpec) -> tuple[float, np.ndarray]:
        """Compute time on one TensorCore at step 0 and at each sampled step t."""
        return self._per_step([c.compute_seconds(spec, 1) for c, _ in self.parts])

    def dma_bytes(self) -> tuple[float, np.ndarray]:
        """Manual-DMA bytes at step 0 and at each sampled step t."""
        return self._per_step([c.dma_bytes for c, _ in self.parts])

    def dma_count(self) -> tuple[float, np.ndarray]:
        """Manual DMAs started at step 0 and at each sampled step t."""
        return self._per_step([c.dma_count for c, _ in self.parts])

    def totals(self) -> OpCounts:
        """Work summed over the whole grid."""
        total = OpCounts()
        for counts, times in self.parts:
            runs = self._times(times)
            total.add(counts, float(runs[0]) + self.sample.weight * float(runs[1:].sum()))
        return total

    def _times(self, times: Any) -> np.ndarray:
        return np.broadcast_to(np.asarray(times, dtype=np.float64), (1 + len(self.sample.t),))

    def _per_step(self, values: list[float]) -> tuple[float, np.ndarray]:
        per = np.zeros(1 + len(self.sample.t))
        for value, (_, times) in zip(values, self.parts):
            if value:
                per = per + value * self._times(times)
        return float(per[0]), per[1:]


def kernel_axes(grid_mapping: Any) -> list[int]:
    """The grid axes the kernel body sees, in order (``program_id(a)`` is ``grid[kernel_axes[a]]``)."""
    vmapped = set(getattr(grid_mapping, "vmapped_dims", ()) or ())
    return [axis for axis in range(len(grid_mapping.grid)) if axis not in vmapped]


def step_work(kernel: core.Jaxpr, grid_mapping: Any, sample: GridSample,
              prefetch: list[np.ndarray] | None) -> StepWork:
    """The kernel body's work, charged at step 0 and at the sampled steps for the times each part runs."""
    notes: list[str] = []
    try:
        records = step_records(kernel, grid_mapping, sample, prefetch, notes)
    except Exception as exc:  # an exotic body: branches fall back to their heavier side, loops are refused
        notes.append(f"control flow not followed ({type(exc).__name__}): heavier branches charged")
        records = {}
    return StepWork(charges(kernel, records, 1.0), sample, notes)


def step_records(kernel: core.Jaxpr, grid_mapping: Any, sample: GridSample, prefetch: list[np.ndarray] | None,
                 notes: list[str]) -> dict[Path, np.ndarray]:
    """Execution counts of every resolvable site at step 0 and at each sampled step (leading axis)."""
    n_pre = grid_mapping.num_index_operands
    axes = kernel_axes(grid_mapping)
    grid = sample.grid
    known = prefetch is not None
    args = [RefCell(i) if known else UNKNOWN for i in range(n_pre)] + [UNKNOWN] * (len(kernel.invars) - n_pre)
    initial = {i: np.asarray(v) for i, v in enumerate(prefetch)} if known else {}

    def one_step(ids: list[Any], state: dict[int, Any]) -> tuple[dict[int, Any], dict[Path, Any]]:
        interp = Interpreter(ids, grid, axes, state, small=KERNEL_SMALL)
        interp.run(kernel, [], args, ())
        return interp.state, interp.records

    points = np.concatenate([[0], sample.t])
    ids = [np.asarray(c, dtype=np.int32) for c in np.unravel_index(points, grid)] if grid else []
    state = dict(initial)
    writes = _writes(kernel, n_pre)
    if sample.sampled or not writes:
        if writes:
            notes.append("the kernel writes its scalar-prefetch refs; on a sampled grid they are read as drawn")

        def at_point(point_ids: list[Any]) -> dict[Path, Any]:
            return one_step(point_ids, state)[1]

        records = jax.jit(jax.vmap(at_point))(ids) if ids else at_point([])
        return {k: np.asarray(v) for k, v in records.items()}

    def scan_step(carry: dict[int, Any], point_ids: list[Any]) -> tuple[dict[int, Any], dict[Path, Any]]:
        new, recs = one_step(point_ids, carry)
        lost = {k for k in carry if new.get(k, UNKNOWN) is UNKNOWN}
        if lost:
            raise _StateLost(lost)
        return {k: jnp.asarray(new[k]).astype(jnp.asarray(carry[k]).dtype) for k in carry}, recs

    while True:  # carry the prefetch refs whose contents stay known from one step to the next
        carry0 = {k: jnp.asarray(v) for k, v in state.items()}
        try:
            _, records = jax.jit(lambda c, xs: lax.scan(scan_step, c, xs))(carry0, ids)
        except _StateLost as lost:
            state = {k: v for k, v in state.items() if k not in lost.keys}
            continue
        return {k: np.asarray(v) for k, v in records.items()}


class _StateLost(Exception):
    """A step made some carried prefetch refs unknown: follow the steps again without them."""

    def __init__(self, keys: set[int]) -> None:
        super().__init__(sorted(keys))
        self.keys = keys


def _writes(kernel: core.Jaxpr, n_pre: int) -> bool:
    """Whether the body writes any of its first ``n_pre`` refs (the scalar-prefetch operands)."""
    refs = {id(v) for v in kernel.invars[:n_pre]}
    return any(isinstance(e, (WriteEffect, AccumEffect)) and id(e.input) in refs for e in kernel.effects)
