"""The work of a kernel body, grid step by grid step.

A top-level ``pl.when`` (a ``cond`` in the kernel jaxpr) is charged only at the steps where it runs when its
predicate depends on nothing but ``program_id``/``num_programs`` and scalar-prefetch values: the predicate
is sliced out of the body and evaluated at the model's grid steps. This is what makes a causal attention
kernel that skips blocks above the diagonal, or a matmul that stores its accumulator on the last k step,
cost what it does. Any other branch is charged as its larger side on every step (see ``ops``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from jax._src import core
from jax._src.state import discharge

from maxkernel.targets.grid import GridSample
from maxkernel.targets.ops import OpCounts, count_eqn, count_ops, largest
from maxkernel.targets.specs import TpuSpec


@dataclass
class BranchSite:
    """A top-level cond whose branch is known at every step looked at."""

    branches: list[OpCounts]
    at_first: int
    at_t: np.ndarray


@dataclass
class StepWork:
    base: OpCounts  # charged on every step
    sites: list[BranchSite]
    sample: GridSample
    notes: list[str] = field(default_factory=list)

    def seconds(self, spec: TpuSpec) -> tuple[float, np.ndarray]:
        """Compute time on one TensorCore at step 0 and at each sampled step t."""
        return self._per_step([b.compute_seconds(spec, 1) for b in self._all()], self.base.compute_seconds(spec, 1))

    def dma_bytes(self) -> tuple[float, np.ndarray]:
        """Manual-DMA bytes at step 0 and at each sampled step t."""
        return self._per_step([b.dma_bytes for b in self._all()], self.base.dma_bytes)

    def totals(self) -> OpCounts:
        """Work summed over the whole grid."""
        total = OpCounts()
        total.add(self.base, float(self.sample.steps))
        for site in self.sites:
            for index, branch in enumerate(site.branches):
                runs = float(site.at_first == index) + self.sample.weight * float(np.sum(site.at_t == index))
                total.add(branch, runs)
        return total

    def _all(self) -> list[OpCounts]:
        return [branch for site in self.sites for branch in site.branches]

    def _per_step(self, values: list[float], base: float) -> tuple[float, np.ndarray]:
        first, per_t, pos = base, np.full(len(self.sample.t), base), 0
        for site in self.sites:
            table = np.asarray(values[pos:pos + len(site.branches)])
            pos += len(site.branches)
            first += float(table[site.at_first])
            per_t = per_t + table[site.at_t]
        return first, per_t


def step_work(kernel: core.Jaxpr, num_prefetch: int, sample: GridSample,
              prefetch: list[np.ndarray] | None) -> StepWork:
    """Split a kernel body into work done every step and top-level conds resolved per step."""
    prefetch_refs = list(kernel.invars[:num_prefetch])
    base = OpCounts()
    pending: list[tuple[list[OpCounts], Predicate | int]] = []
    notes: list[str] = []
    for position, eqn in enumerate(kernel.eqns):
        if eqn.primitive.name != "cond":
            count_eqn(eqn, base)
            continue
        branches = [count_ops(b.jaxpr) for b in eqn.params["branches"]]
        pred = eqn.invars[0]
        if isinstance(pred, core.Literal):
            pending.append((branches, int(pred.val)))
            continue
        program = _predicate_program(kernel, position, pred, prefetch_refs, prefetch is not None)
        if program is None:
            base.add(largest(branches))
            notes.append("a pl.when predicate depends on data: its larger branch is charged every step")
        else:
            pending.append((branches, program))
    try:
        sites = _resolve(pending, sample, prefetch_refs, prefetch)
    except Exception as exc:  # an exotic predicate: fall back to charging the larger branch everywhere
        notes.append(f"pl.when predicates not evaluated ({type(exc).__name__}): larger branches charged")
        for branches, _ in pending:
            base.add(largest(branches))
        sites = []
    return StepWork(base, sites, sample, notes)


@dataclass
class Predicate:
    """A cond's branch index as a pure program of (grid ids and grid sizes it reads, prefetch values)."""

    program: core.ClosedJaxpr
    grid_inputs: list[tuple[str, int]]  # ("program_id" | "num_programs", axis) for each leading input


def _predicate_program(kernel: core.Jaxpr, position: int, pred: core.Var, prefetch_refs: list[core.Var],
                       prefetch_known: bool) -> Predicate | None:
    """The equations computing ``pred``, with ``program_id``/``num_programs`` turned into inputs; None if
    the predicate reads kernel data (or prefetch values that are unknown)."""
    needed, chosen = {pred}, []
    for eqn in reversed(kernel.eqns[:position]):
        if any(v in needed for v in eqn.outvars):
            chosen.append(eqn)
            needed.update(v for v in eqn.invars if isinstance(v, core.Var))
    produced = {v for eqn in chosen for v in eqn.outvars}
    free = needed - produced
    if not free <= set(prefetch_refs) or (free and not prefetch_known):
        return None
    chosen.reverse()
    grid_vars = [eqn.outvars[0] for eqn in chosen if eqn.primitive.name in _GRID_PRIMITIVES]
    grid_inputs = [(eqn.primitive.name, int(eqn.params["axis"]))
                   for eqn in chosen if eqn.primitive.name in _GRID_PRIMITIVES]
    body = [eqn for eqn in chosen if eqn.primitive.name not in _GRID_PRIMITIVES]
    effects = core.join_effects(*(eqn.effects for eqn in body))
    debug = core.DebugInfo("pl.when predicate", "maxkernel.targets.work", None, None)
    jaxpr = core.Jaxpr((), [*grid_vars, *prefetch_refs], [pred], body, effects, debug)
    program = core.ClosedJaxpr(jaxpr, ())
    if prefetch_refs:
        flags = [False] * len(grid_vars) + [True] * len(prefetch_refs)
        program = discharge.discharge_state(program, should_discharge=flags)
    return Predicate(program, grid_inputs)


_GRID_PRIMITIVES = ("program_id", "num_programs")


def _resolve(pending: list[tuple[list[OpCounts], Predicate | int]], sample: GridSample,
             prefetch_refs: list[core.Var], prefetch: list[np.ndarray] | None) -> list[BranchSite]:
    predicates = [p for _, p in pending if isinstance(p, Predicate)]
    results: list[tuple[np.ndarray, np.ndarray]] = []
    if predicates:
        values = prefetch if prefetch is not None else [
            np.zeros(v.aval.shape, v.aval.dtype) for v in prefetch_refs]

        def evaluate_all(grid_ids: list[Any], refs: list[Any]) -> list[Any]:
            outs = []
            for predicate in predicates:
                inputs = [grid_ids[axis] if kind == "program_id" else np.int32(sample.grid[axis])
                          for kind, axis in predicate.grid_inputs]
                outs.append(core.eval_jaxpr(predicate.program.jaxpr, predicate.program.consts, *inputs, *refs)[0])
            return outs

        first, _, at_t = sample.evaluate(evaluate_all, values)
        results = list(zip(first, at_t))
    sites, found = [], iter(results)
    for branches, predicate in pending:
        last = len(branches) - 1
        if isinstance(predicate, int):
            index = min(max(predicate, 0), last)
            sites.append(BranchSite(branches, index, np.full(len(sample.t), index)))
        else:
            at_first, at_t = next(found)
            sites.append(BranchSite(branches, int(np.clip(at_first[0], 0, last)),
                                    np.clip(at_t.astype(np.int64), 0, last)))
    return sites
