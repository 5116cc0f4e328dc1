"""What traced code actually runs: how often each ``cond`` branch is taken and how many trips each loop makes.

A cost model that charges every branch and counts a ``while`` body once lets a candidate hide its work in a
data-dependent loop. This module re-runs a program's *control* part on the values the model can know and
records, for every ``cond`` and ``while``/``scan`` site (named by its :data:`Path`), absolute execution
counts: ``counts[j]`` times branch ``j`` ran, ``trips`` times a loop body ran.

Known values are the grid indices and sizes of a kernel, its scalar-prefetch operands (including what the
kernel writes into them, followed step by step), the task's small integer inputs (group sizes, page tables,
lengths), and anything computed from those that stays small. Everything else (tensor data, VMEM contents,
kernel outputs) is :data:`UNKNOWN`; a site whose predicate or trip count depends on it gets no record, and
the caller decides (charge the heavier branch; refuse an unbounded loop). Nothing large is materialised:
an operation whose result exceeds ``small`` elements yields UNKNOWN instead of being computed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax._src import core, source_info_util
from jax._src.state import discharge
from jax._src.state.types import AccumEffect, WriteEffect

from maxkernel.targets.jaxpr_walk import CALL_PRIMITIVES, sub_jaxprs

Path = tuple[int | str, ...]
MAX_TRIPS = 1 << 24  # a loop the interpreter follows stops here (it would not finish on any TPU either)


class _Unknown:
    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN: Any = _Unknown()


@dataclass(frozen=True)
class RefCell:
    """A ref whose contents the interpreter follows (a scalar-prefetch operand); ``key`` indexes the state."""

    key: int


class _Incomplete(Exception):
    """A loop's control values became unknown inside its body: the loop cannot be followed."""


class _CellsLost(Exception):
    """A loop trip made some followed state refs unknown: follow the loop again without them."""

    def __init__(self, keys: set[int]) -> None:
        super().__init__(sorted(keys))
        self.keys = keys


def site_name(eqn: core.JaxprEqn) -> str:
    """Where a loop or branch was written, for messages: ``file:line (function)``."""
    return source_info_util.summarize(eqn.source_info)


class Interpreter:
    """One evaluation of the control part of a program (traced under ``jax.vmap``/``lax.scan`` by callers).

    ``grid_ids``/``grid_sizes`` answer ``program_id``/``num_programs`` (``kernel_axes[a]`` is the grid axis
    the kernel's axis ``a`` stands for: vmapped grid axes are invisible to the kernel). ``state`` holds the
    current values of the :class:`RefCell` refs.
    """

    def __init__(self, grid_ids: Sequence[Any] = (), grid_sizes: Sequence[int] = (),
                 kernel_axes: Sequence[int] = (), state: dict[int, Any] | None = None, small: int = 1 << 12) -> None:
        self.grid_ids = list(grid_ids)
        self.grid_sizes = list(grid_sizes)
        self.kernel_axes = list(kernel_axes)
        self.state: dict[int, Any] = dict(state or {})
        self.small = small
        self.records: dict[Path, Any] = {}

    # -- the walk ---------------------------------------------------------------------------------------
    def run(self, jaxpr: core.Jaxpr, consts: Sequence[Any], args: Sequence[Any], path: Path,
            active: Any = True) -> list[Any]:
        env: dict[core.Var, Any] = {}

        def read(v: core.Atom) -> Any:
            return v.val if isinstance(v, core.Literal) else env.get(v, UNKNOWN)

        for var, val in zip(jaxpr.constvars, consts):
            env[var] = val
        for var, val in zip(jaxpr.invars, args):
            env[var] = val
        for position, eqn in enumerate(jaxpr.eqns):
            invals = [read(v) for v in eqn.invars]
            outs = self._eqn(eqn, invals, (*path, position), active)
            for var, val in zip(eqn.outvars, outs):
                env[var] = val
        return [read(v) for v in jaxpr.outvars]

    def _eqn(self, eqn: core.JaxprEqn, invals: list[Any], here: Path, active: Any) -> list[Any]:
        name = eqn.primitive.name
        unknown = [UNKNOWN] * len(eqn.outvars)
        if name == "program_id":
            axis = self.kernel_axes[int(eqn.params["axis"])] if self.kernel_axes else None
            return unknown if axis is None else [self.grid_ids[axis]]
        if name == "num_programs":
            axis = self.kernel_axes[int(eqn.params["axis"])] if self.kernel_axes else None
            return unknown if axis is None else [np.int32(self.grid_sizes[axis])]
        if name == "cond":
            return self._cond(eqn, invals, here, active)
        if name in ("while", "scan"):
            return self._loop(eqn, invals, here, active)
        called = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
        if name in CALL_PRIMITIVES and isinstance(called, core.ClosedJaxpr):
            return self.run(called.jaxpr, called.consts, invals, (*here, 0), active)
        if name in CALL_PRIMITIVES and isinstance(called, core.Jaxpr):
            return self.run(called, [], invals, (*here, 0), active)
        if name == "run_scoped" and isinstance(called, core.Jaxpr):
            self.run(called, invals, [UNKNOWN] * len(called.invars), (*here, 0), active)
            return unknown
        if any(isinstance(x, RefCell) for x in invals):
            return self._ref_op(eqn, invals)
        # Effectful primitives (semaphores, DMAs, callbacks) and large results are not computed.
        if eqn.effects or name == "pallas_call" or any(x is UNKNOWN for x in invals) or not self._small(eqn):
            return unknown
        params = eqn.primitive.get_bind_params(eqn.params)
        out = eqn.primitive.bind(*invals, **params)
        return list(out) if eqn.primitive.multiple_results else [out]

    def _small(self, eqn: core.JaxprEqn) -> bool:
        for var in eqn.outvars:
            aval = var.aval
            if not hasattr(aval, "shape") or isinstance(aval, core.AbstractToken):
                return False
            if int(np.prod(aval.shape)) > self.small:
                return False
        return True

    # -- refs -------------------------------------------------------------------------------------------
    def _forget_written(self, eqn: core.JaxprEqn, invals: list[Any]) -> None:
        written = {id(e.input) for e in eqn.effects if isinstance(e, (WriteEffect, AccumEffect))}
        for var, cell in zip(eqn.invars, invals):
            if isinstance(cell, RefCell) and id(var) in written:
                self.state[cell.key] = UNKNOWN

    def _ref_op(self, eqn: core.JaxprEqn, invals: list[Any]) -> list[Any]:
        unknown = [UNKNOWN] * len(eqn.outvars)
        rule = discharge._discharge_rules.get(eqn.primitive)
        cell = invals[0]
        rest = invals[1:]
        if (rule is None or not isinstance(cell, RefCell) or any(isinstance(x, RefCell) for x in rest)
                or any(x is UNKNOWN for x in rest) or self.state.get(cell.key, UNKNOWN) is UNKNOWN):
            self._forget_written(eqn, invals)
            return unknown
        in_avals = [v.aval for v in eqn.invars]
        out_avals = [v.aval for v in eqn.outvars]
        new_invals, ans = rule(in_avals, out_avals, self.state[cell.key], *rest, **eqn.params)
        if new_invals[0] is not None:
            self.state[cell.key] = new_invals[0]
        if not eqn.outvars:
            return []
        return list(ans) if eqn.primitive.multiple_results else [ans]

    # -- control flow -----------------------------------------------------------------------------------
    def _cond(self, eqn: core.JaxprEqn, invals: list[Any], here: Path, active: Any) -> list[Any]:
        branches = eqn.params["branches"]
        index, operands = invals[0], invals[1:]
        if index is UNKNOWN:
            self._forget_written(eqn, invals)
            return [UNKNOWN] * len(eqn.outvars)
        last = len(branches) - 1
        index = jnp.clip(jnp.asarray(index).astype(jnp.int32), 0, last)
        self.records[here] = jnp.where(active, jax.nn.one_hot(index, last + 1, dtype=jnp.int32), 0)
        saved = dict(self.state)
        results, states = [], []
        for j, branch in enumerate(branches):
            self.state = dict(saved)
            results.append(self.run(branch.jaxpr, branch.consts, operands, (*here, j),
                                    jnp.logical_and(active, index == j)))
            states.append(self.state)
        self.state = {key: _select(index, [s.get(key, UNKNOWN) for s in states]) for key in saved}
        return [_select(index, list(column)) for column in zip(*results)]

    def _loop(self, eqn: core.JaxprEqn, invals: list[Any], here: Path, active: Any) -> list[Any]:
        """Follow a ``while`` (or ``scan``) over the carry elements its trip count depends on, accumulating the
        records of the body's own sites; no record when the trip count depends on unknown values."""
        try:
            return self._follow(eqn, invals, here, active)
        except _Incomplete:
            self._forget_written(eqn, invals)
            return [UNKNOWN] * len(eqn.outvars)

    def _follow(self, eqn: core.JaxprEqn, invals: list[Any], here: Path, active: Any) -> list[Any]:
        is_scan = eqn.primitive.name == "scan"
        if is_scan:
            nconst, ncarry = eqn.params["num_consts"], eqn.params["num_carry"]
            body = eqn.params["jaxpr"]
            if not has_sites(body.jaxpr):  # nothing inside to resolve: its trip count is its length
                self.records[here] = jnp.where(active, int(eqn.params["length"]), 0)
                self._forget_written(eqn, invals)
                return [UNKNOWN] * len(eqn.outvars)
            consts, init, xs = invals[:nconst], invals[nconst:nconst + ncarry], invals[nconst + ncarry:]
            if any(x is not UNKNOWN and np.prod(np.shape(x)) > self.small for x in xs):
                raise _Incomplete
            cond, cconsts = None, []
            body_in = lambda carry, x: [*consts, *carry, *x]  # noqa: E731
        else:
            cn, bn = eqn.params["cond_nconsts"], eqn.params["body_nconsts"]
            cond, body = eqn.params["cond_jaxpr"], eqn.params["body_jaxpr"]
            cconsts, consts, init = invals[:cn], invals[cn:cn + bn], invals[cn + bn:]
            xs = []
            body_in = lambda carry, x: [*consts, *carry]  # noqa: E731
        followed = [x is not UNKNOWN and not isinstance(x, RefCell) for x in init]
        while True:  # the carry elements whose values stay known from one trip to the next
            flags = [_known(c) for c in consts] + followed + ([_known(x) for x in xs] if is_scan else [])
            out = known_outputs(body.jaxpr, flags)[:len(init)]
            new = [f and o for f, o in zip(followed, out)]
            if new == followed:
                break
            followed = new
        if cond is not None and not known_outputs(cond.jaxpr, [_known(c) for c in cconsts] + followed)[0]:
            raise _Incomplete
        keep = [i for i, f in enumerate(followed) if f]
        xs_known = [x if x is not UNKNOWN else None for x in xs]
        cells = [k for k, v in self.state.items() if v is not UNKNOWN]

        def carry_of(values: Sequence[Any]) -> list[Any]:
            full = [UNKNOWN] * len(init)
            for i, v in zip(keep, values):
                full[i] = v
            return full

        def one_trip(values: Sequence[Any], cell_values: Sequence[Any], x: Sequence[Any],
                     on: Any) -> tuple[list[Any], list[Any], dict[Path, Any]]:
            inner = self._inner(cells, cell_values)
            x_vals = [UNKNOWN if v is None else v for v in x]
            outs = inner.run(body.jaxpr, body.consts, body_in(carry_of(values), x_vals), (*here, 0), on)
            nxt = [outs[i] for i in keep]
            new_cells = [inner.state.get(k, UNKNOWN) for k in cells]
            if any(v is UNKNOWN for v in nxt):
                raise _Incomplete
            return nxt, new_cells, inner.records

        slots = site_shapes(body.jaxpr, (*here, 0))
        seen: set[Path] = set()

        def advance(carry: tuple, x: Sequence[Any]) -> tuple:
            values, cell_values, acc = carry
            nxt, new_cells, recs = one_trip(values, cell_values, x, active)
            lost = {k for k, v in zip(cells, new_cells) if v is UNKNOWN}
            if lost:
                raise _CellsLost(lost)
            seen.update(recs)
            acc = {k: acc[k] + recs[k] if k in recs else acc[k] for k in acc}
            return _like(nxt, values), _like(new_cells, cell_values), acc

        while True:  # the state refs that stay known through a trip are carried along
            start = ([jnp.asarray(init[i]) for i in keep], [jnp.asarray(self.state[k]) for k in cells],
                     {k: jnp.zeros(shape, jnp.int32) for k, shape in slots.items()})
            try:
                final, final_cells, acc, trips = self._iterate(
                    eqn, is_scan, advance, start, xs_known, cond, cconsts, cells, carry_of, here, active)
                break
            except _CellsLost as lost:
                for k in lost.keys:
                    self.state[k] = UNKNOWN
                cells = [k for k in cells if k not in lost.keys]
        self.records.update({k: v for k, v in acc.items() if k in seen})
        self.records[here] = trips
        for k, v in zip(cells, final_cells):
            self.state[k] = v
        outs = [UNKNOWN] * len(eqn.outvars)
        for i, v in zip(keep, final):
            outs[i] = v
        return outs

    def _iterate(self, eqn: core.JaxprEqn, is_scan: bool, advance: Any, start: tuple, xs_known: list[Any],
                 cond: Any, cconsts: list[Any], cells: list[int], carry_of: Any, here: Path,
                 active: Any) -> tuple[Any, Any, Any, Any]:
        """Run the loop (``lax.scan`` or ``lax.while_loop``) over the followed carry; returns the final carry,
        the final state refs, the accumulated records of the body's sites and the trip count."""
        if is_scan:
            length = int(eqn.params["length"])
            xs_slices = [None if v is None else jnp.asarray(v) for v in xs_known]
            present = [v for v in xs_slices if v is not None]
            (final, final_cells, acc), _ = lax.scan(
                lambda c, x: (advance(c, _refill(xs_slices, x)), None), start, present, length=length)
            return final, final_cells, acc, jnp.where(active, length, 0)

        def keep_going(carry: tuple) -> Any:
            count, (values, cell_values, _) = carry
            (go,) = self._inner(cells, cell_values).run(
                cond.jaxpr, cond.consts, [*cconsts, *carry_of(values)], (*here, "cond"))
            if go is UNKNOWN:
                raise _Incomplete
            return jnp.logical_and(jnp.logical_and(active, go), count < MAX_TRIPS)

        trips, (final, final_cells, acc) = lax.while_loop(
            keep_going, lambda c: (c[0] + 1, advance(c[1], [])), (jnp.int32(0), start))
        return final, final_cells, acc, trips

    def _inner(self, cells: Sequence[int], values: Sequence[Any]) -> "Interpreter":
        """An interpreter for one loop trip: the followed state refs hold ``values``, the others are unknown."""
        state = {k: UNKNOWN for k in self.state}
        state.update(zip(cells, values))
        return Interpreter(self.grid_ids, self.grid_sizes, self.kernel_axes, state, self.small)


def _like(new: Sequence[Any], old: Sequence[Any]) -> list[Any]:
    """Loop-carried values keep their dtype from one trip to the next."""
    return [jnp.asarray(n).astype(jnp.asarray(o).dtype) for n, o in zip(new, old)]


def _refill(slots: list[Any], present: list[Any]) -> list[Any]:
    it = iter(present)
    return [None if s is None else next(it) for s in slots]


def _known(value: Any) -> bool:
    return value is not UNKNOWN


def _select(index: Any, options: list[Any]) -> Any:
    first = options[0]
    if all(o is first for o in options):
        return first
    if any(o is UNKNOWN or isinstance(o, RefCell) for o in options):
        return UNKNOWN
    arrays = [jnp.asarray(o) for o in options]
    if any(a.shape != arrays[0].shape or a.dtype != arrays[0].dtype for a in arrays):
        return UNKNOWN
    return lax.select_n(index, *arrays) if len(arrays) > 1 else arrays[0]


def site_shapes(jaxpr: core.Jaxpr, path: Path) -> dict[Path, tuple[int, ...]]:
    """Every site the interpreter may record inside ``jaxpr`` (reached at ``path``), with its record's shape:
    branch counts for a ``cond``, a trip count for a loop. Mirrors the paths :class:`Interpreter` gives."""
    found: dict[Path, tuple[int, ...]] = {}
    for position, eqn in enumerate(jaxpr.eqns):
        here, name = (*path, position), eqn.primitive.name
        called = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
        if name == "cond":
            found[here] = (len(eqn.params["branches"]),)
            for j, branch in enumerate(eqn.params["branches"]):
                found.update(site_shapes(branch.jaxpr, (*here, j)))
        elif name in ("while", "scan"):
            found[here] = ()
            body = eqn.params["body_jaxpr" if name == "while" else "jaxpr"]
            found.update(site_shapes(body.jaxpr, (*here, 0)))
        elif name in CALL_PRIMITIVES and isinstance(called, core.ClosedJaxpr):
            found.update(site_shapes(called.jaxpr, (*here, 0)))
        elif name in (*CALL_PRIMITIVES, "run_scoped") and isinstance(called, core.Jaxpr):
            found.update(site_shapes(called, (*here, 0)))
    return found


def has_sites(jaxpr: core.Jaxpr) -> bool:
    """Whether a program holds a branch or a while loop anywhere (a site the interpreter can resolve)."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in ("cond", "while"):
            return True
        if eqn.primitive.name != "pallas_call" and any(has_sites(sub) for _, sub in sub_jaxprs(eqn)):
            return True
    return False


def known_outputs(jaxpr: core.Jaxpr, known_in: Sequence[bool]) -> list[bool]:
    """Which outputs of ``jaxpr`` are computable when only the inputs flagged in ``known_in`` are known
    (constants are known; ``program_id`` and friends need no input). A data-flow pass that looks into
    branches, loops and calls the way :class:`Interpreter` follows them."""
    known = {v for v, k in zip(jaxpr.invars, known_in) if k} | set(jaxpr.constvars)

    def is_known(v: core.Atom) -> bool:
        return isinstance(v, core.Literal) or v in known

    for eqn in jaxpr.eqns:
        flags = [is_known(v) for v in eqn.invars]
        outs = _eqn_known(eqn, flags)
        known.update(v for v, k in zip(eqn.outvars, outs) if k)
    return [is_known(v) for v in jaxpr.outvars]


def _eqn_known(eqn: core.JaxprEqn, flags: list[bool]) -> list[bool]:
    name = eqn.primitive.name
    called = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
    if name == "cond":
        if not flags[0]:
            return [False] * len(eqn.outvars)
        per_branch = [known_outputs(b.jaxpr, flags[1:]) for b in eqn.params["branches"]]
        return [all(column) for column in zip(*per_branch)]
    if name == "while":
        cn, bn = eqn.params["cond_nconsts"], eqn.params["body_nconsts"]
        body, cond = eqn.params["body_jaxpr"].jaxpr, eqn.params["cond_jaxpr"].jaxpr
        consts, carry = flags[cn:cn + bn], flags[cn + bn:]
        while True:
            new = [c and o for c, o in zip(carry, known_outputs(body, consts + carry))]
            if new == carry:
                break
            carry = new
        return carry if known_outputs(cond, flags[:cn] + carry)[0] else [False] * len(carry)
    if name in CALL_PRIMITIVES and isinstance(called, core.ClosedJaxpr):
        return known_outputs(called.jaxpr, flags)
    if name in CALL_PRIMITIVES and isinstance(called, core.Jaxpr):
        return known_outputs(called, flags)
    ok = name not in ("pallas_call", "scan", "run_scoped") and all(flags)
    return [ok] * len(eqn.outvars)
