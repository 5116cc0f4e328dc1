"""What part of each operand a pallas_call's grid visits: a kernel priced at ``full`` must not skip blocks
that its checked twin visits.

A twin keeps the same kernels, bodies and block shapes at a smaller size, but the grid extents change with
the size, and a candidate can compute them differently at the size it is priced at (a GEMM that runs half
its reduction steps only when the rows exceed what any check size has). Such a kernel reads only part of an
input, or writes only part of its output, where it is priced. For every operand whose index map the model
can evaluate (no scalar-prefetch values), the fraction of its blocks the grid visits is computed at both
sizes; a priced fraction below the checked one is a difference, so the check moves to a size that runs it.
"""

from __future__ import annotations

import math

import jax
import numpy as np
from jax._src import core

from maxkernel.targets.blocks import _HBM_SPACES, memory_space, uses_refs
from maxkernel.targets.grid import EXACT_STEPS
from maxkernel.targets.jaxpr_walk import PallasCall, find_pallas_calls


def visited_fractions(call: PallasCall) -> list[float | None]:
    """For each operand (inputs then outputs): the fraction of its blocks some grid step maps to; None where
    it cannot be told (a dynamic grid, a grid too large to enumerate, an index map reading prefetch values,
    an operand left in HBM)."""
    grid_mapping = call.eqn.params["grid_mapping"]
    grid = grid_mapping.grid
    mappings = list(grid_mapping.block_mappings)
    if not all(isinstance(g, (int, np.integer)) for g in grid) or math.prod(grid) > EXACT_STEPS:
        return [None] * len(mappings)
    n_grid = len(grid)
    steps = max(1, math.prod(int(g) for g in grid))
    ids = [np.asarray(c, np.int32) for c in np.unravel_index(np.arange(steps), tuple(int(g) for g in grid))] \
        if grid else []
    out: list[float | None] = []
    for bm in mappings:
        closed = bm.index_map_jaxpr
        if uses_refs(closed.jaxpr, n_grid) or memory_space(bm.transformed_block_aval) in _HBM_SPACES:
            out.append(None)
            continue
        dims = [getattr(d, "block_size", None) for d in bm.block_shape]
        if any(d is not None and not isinstance(d, (int, np.integer)) for d in dims):
            out.append(None)
            continue
        extent = [int(s) if d is None else int(d) for s, d in zip(bm.array_aval.shape, dims)]
        blocks = [-(-int(s) // e) for s, e in zip(bm.array_aval.shape, extent)]
        n_index = len(closed.jaxpr.invars)
        try:
            values = jax.vmap(lambda *g: core.eval_jaxpr(closed.jaxpr, closed.consts, *g),
                              axis_size=steps)(*ids[:n_index]) if n_index else \
                core.eval_jaxpr(closed.jaxpr, closed.consts)
        except Exception:  # an index map the model cannot run on its own: nothing is claimed
            out.append(None)
            continue
        columns = [np.broadcast_to(np.asarray(v).reshape(-1), (steps,)) for v in values]
        if not columns:
            out.append(1.0 if math.prod(blocks) == 1 else None)
            continue
        visited = {tuple(row) for row in np.stack(columns, axis=1).tolist()
                   if all(0 <= c < b for c, b in zip(row, blocks))}
        out.append(len(visited) / max(1, math.prod(blocks)))
    return out


def coverage_difference(priced: core.Jaxpr, checked: core.Jaxpr) -> str | None:
    """The first operand a priced kernel visits less of than its checked twin does, or None."""
    for p, c in zip(find_pallas_calls(priced), find_pallas_calls(checked)):
        origins = [str(bm.origin) for bm in p.eqn.params["grid_mapping"].block_mappings]
        for origin, at_full, at_check in zip(origins, visited_fractions(p), visited_fractions(c)):
            if at_full is not None and at_check is not None and at_full < at_check - 1e-9:
                return (f"kernel {p.name} visits {at_full:.0%} of the blocks of {origin} where priced and "
                        f"{at_check:.0%} here: its grid skips work only at the priced size")
    return None
