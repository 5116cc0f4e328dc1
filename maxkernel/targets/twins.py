"""Priced = checked: does the program traced at the checked size run the code the model prices at ``full``?

The model prices the candidate traced at ``full``; correctness is run at a smaller "check" size. The two
traces are twins when every priced pallas_call has a checked counterpart, in the same order, with

- the same block shapes (operands whose block is the whole array are grid-invariant and may differ),
- at least two grid steps along every axis that has two or more at ``full`` (so the block pipeline, the
  first/last-step branches and the index maps between blocks all run), and likewise at least two trips of
  every static loop (``scan``, ``fori_loop`` with static bounds) that makes two or more at ``full``, in the
  kernel bodies and in the XLA code (loops whose trip count is read from the data are not seen here),
- the same kernel body and index maps: equal equation by equation, up to shapes and integer literals
  (grid extents and offsets scale with the size; float and boolean constants, primitives, parameters
  other than integers, and the wiring between equations must match),

and the XLA code around the kernels is the same sequence of primitives. Anything else means code that is
priced was never run, and the first difference is named.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from jax._src import core

from maxkernel.targets.blocks import blocks_of
from maxkernel.targets.jaxpr_walk import PallasCall, find_pallas_calls, sub_jaxprs
from maxkernel.targets.loader import eqn_line

# pallas_call parameters compared on their own (bodies, blocks) or that only describe shapes and debugging.
_CALL_PARAMS_APART = frozenset({"jaxpr", "grid_mapping", "out_avals", "debug", "cost_estimate", "metadata",
                                "name_and_src_info", "interpret"})
_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")
_INTEGER = re.compile(r"\d+")


@dataclass(frozen=True)
class KernelConfig:
    """What the twin check needs of one pallas_call: its grid, each operand's block (None: whole array) and
    the trip counts of the static loops in its body."""

    name: str
    grid: tuple[object, ...]
    blocks: tuple[tuple[str, tuple[int, ...] | None], ...]
    loops: tuple[int, ...]

    @classmethod
    def of(cls, call: PallasCall) -> "KernelConfig":
        mapping = call.eqn.params["grid_mapping"]
        blocks = []
        for bm, block in zip(mapping.block_mappings, blocks_of(mapping)):
            whole = not block.pipelined or block.block_shape == tuple(bm.array_aval.shape)
            blocks.append((block.origin, None if whole else block.block_shape))
        return cls(call.name, tuple(mapping.grid), tuple(blocks), tuple(scan_lengths(call.eqn.params["jaxpr"])))


@dataclass(frozen=True)
class Configuration:
    """A traced program as the check size sees it: its kernels, and the static loops of the XLA code."""

    kernels: tuple[KernelConfig, ...]
    loops: tuple[int, ...]

    @classmethod
    def of(cls, jaxpr: core.Jaxpr) -> "Configuration":
        return cls(tuple(KernelConfig.of(c) for c in find_pallas_calls(jaxpr)), tuple(scan_lengths(jaxpr)))


def scan_lengths(jaxpr: core.Jaxpr) -> list[int]:
    """Trip counts of the ``scan`` loops (``fori_loop`` with static bounds) in program order, not looking
    into pallas_call bodies."""
    found: list[int] = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "pallas_call":
            continue
        if eqn.primitive.name == "scan":
            found.append(int(eqn.params["length"]))
        for _, sub in sub_jaxprs(eqn):
            found.extend(scan_lengths(sub))
    return found


def static_steps(extent: object) -> int | None:
    return int(extent) if isinstance(extent, (int, np.integer)) else None


def _loops_difference(label: str, priced: tuple[int, ...], checked: tuple[int, ...]) -> str | None:
    if len(priced) != len(checked):
        return f"{label} has {len(priced)} static loop(s) at full size but {len(checked)} at the check size"
    for n, (full_trips, check_trips) in enumerate(zip(priced, checked)):
        if full_trips >= 2 and check_trips < 2:
            return (f"{label}: static loop {n + 1} runs {full_trips} times at full size but {check_trips} at the "
                    "check size (the loop-carried path would never run)")
    return None


def configuration_difference(priced: Configuration, checked: Configuration) -> str | None:
    """Why ``checked`` does not run ``priced``'s block configurations with >= 2 steps per multi-step grid
    axis and >= 2 trips per multi-trip static loop."""
    if len(priced.kernels) != len(checked.kernels):
        return f"{len(priced.kernels)} pallas_call(s) at full size but {len(checked.kernels)} at the check size"
    for i, (p, c) in enumerate(zip(priced.kernels, checked.kernels)):
        label = f"kernel {p.name} (pallas_call {i + 1})"
        if len(p.grid) != len(c.grid):
            return f"{label}: grid {p.grid} at full size but {c.grid} at the check size"
        for (origin, block), (_, other) in zip(p.blocks, c.blocks):
            if block != other:
                shown = lambda b: "the whole array" if b is None else str(b)  # noqa: E731
                return f"{label}: block shape of {origin} is {shown(block)} at full size but {shown(other)} at the check size"
        for axis, (full_n, check_n) in enumerate(zip(p.grid, c.grid)):
            full_steps, check_steps = static_steps(full_n), static_steps(check_n)
            if full_steps is None or check_steps is None:
                if (full_steps is None) != (check_steps is None):
                    return f"{label}: grid axis {axis} is {full_n} at full size but {check_n} at the check size"
                continue  # an extent read from the inputs: both traces leave it to the data
            if full_steps >= 2 and check_steps < 2:
                return (f"{label}: grid axis {axis} runs {full_steps} steps at full size but {check_steps} at the "
                        "check size (the multi-step pipeline would never run)")
        found = _loops_difference(f"{label} body", p.loops, c.loops)
        if found:
            return found
    return _loops_difference("the XLA code around the kernels", priced.loops, checked.loops)


def twin_difference(priced: core.Jaxpr, checked: core.Jaxpr, filename: str = "") -> str | None:
    """The first way ``checked`` (traced at the check size) differs from ``priced`` (traced at full), or None;
    equations are located by their line in the candidate file ``filename``."""
    priced_calls, checked_calls = find_pallas_calls(priced), find_pallas_calls(checked)
    found = configuration_difference(Configuration.of(priced), Configuration.of(checked))
    if found:
        return found
    for i, (p, c) in enumerate(zip(priced_calls, checked_calls)):
        label = f"kernel {p.name} (pallas_call {i + 1})"
        found = _call_difference(p.eqn, c.eqn, filename)
        if found:
            return f"{label}: {found}"
    return _xla_difference(priced, checked, filename)


def _call_difference(p: core.JaxprEqn, c: core.JaxprEqn, filename: str) -> str | None:
    for key in sorted(set(p.params) | set(c.params)):
        if key not in _CALL_PARAMS_APART and _masked(p.params.get(key)) != _masked(c.params.get(key)):
            return f"pallas_call parameter {key} is {p.params.get(key)!r} at full size but {c.params.get(key)!r} at the check size"
    found = _jaxpr_difference(p.params["jaxpr"], c.params["jaxpr"], "kernel body", filename)
    if found:
        return found
    pm, cm = p.params["grid_mapping"], c.params["grid_mapping"]
    for bm, other in zip(pm.block_mappings, cm.block_mappings):
        found = _jaxpr_difference(bm.index_map_jaxpr.jaxpr, other.index_map_jaxpr.jaxpr, f"index map of {bm.origin}", filename)
        if found:
            return found
    return None


def _jaxpr_difference(a: core.Jaxpr, b: core.Jaxpr, where: str, filename: str) -> str | None:
    """Equation-by-equation comparison up to shapes and integer literals (see the module docstring)."""
    if (len(a.constvars), len(a.invars), len(a.outvars)) != (len(b.constvars), len(b.invars), len(b.outvars)):
        return f"{where} takes or returns a different number of values at the check size"
    env: dict[core.Var, core.Var] = dict(zip([*a.constvars, *a.invars], [*b.constvars, *b.invars]))
    for index, (ea, eb) in enumerate(zip(a.eqns, b.eqns)):
        at = f"{where}, equation {index + 1}, {_named(ea, filename)}"
        if ea.primitive.name != eb.primitive.name:
            return (f"{where}, equation {index + 1}: {_named(ea, filename)} at full size but "
                    f"{_named(eb, filename)} at the check size (a branch on shape)")
        found = _operands_difference(ea.invars, eb.invars, env)
        if found:
            return f"{at}: {found}"
        for key in sorted(set(ea.params) | set(eb.params)):
            pa, pb = ea.params.get(key), eb.params.get(key)
            subs_a, subs_b = list(_jaxprs_in(pa)), list(_jaxprs_in(pb))
            if subs_a or subs_b:
                if len(subs_a) != len(subs_b):
                    return f"{at}: parameter {key} holds {len(subs_a)} sub-programs at full size but {len(subs_b)} at the check size"
                for n, (sa, sb) in enumerate(zip(subs_a, subs_b)):
                    found = _jaxpr_difference(sa, sb, f"{at} {key}[{n}]", filename)
                    if found:
                        return found
            elif _masked(pa) != _masked(pb):
                return f"{at}: parameter {key} is {pa!r} at full size but {pb!r} at the check size"
        if len(ea.outvars) != len(eb.outvars):
            return f"{at}: a different number of results at the check size"
        env.update(zip(ea.outvars, eb.outvars))
    if len(a.eqns) != len(b.eqns):
        return f"{where} has {len(a.eqns)} equations at full size but {len(b.eqns)} at the check size (a branch on shape)"
    found = _operands_difference(a.outvars, b.outvars, env)
    return f"{where} results: {found}" if found else None


def _operands_difference(xs: list[core.Atom], ys: list[core.Atom], env: dict[core.Var, core.Var]) -> str | None:
    if len(xs) != len(ys):
        return f"{len(xs)} operands at full size but {len(ys)} at the check size"
    for n, (x, y) in enumerate(zip(xs, ys)):
        if isinstance(x, core.Literal) or isinstance(y, core.Literal):
            if not (isinstance(x, core.Literal) and isinstance(y, core.Literal)):
                return f"operand {n + 1} is a constant at one size and computed at the other"
            if not _same_literal(x, y):
                return f"constant {_value_text(x)} at full size but {_value_text(y)} at the check size"
        elif env.get(x) is not y:
            return f"operand {n + 1} comes from a different value at the check size"
    return None


def _same_literal(x: core.Literal, y: core.Literal) -> bool:
    vx, vy = np.asarray(x.val), np.asarray(y.val)
    if vx.dtype != vy.dtype:
        return False
    if vx.dtype.kind in "iu":
        return True  # extents, offsets and step counts scale with the size
    return vx.shape == vy.shape and bool(np.array_equal(vx, vy, equal_nan=vx.dtype.kind in "fc"))


def _value_text(literal: core.Literal) -> str:
    value = np.asarray(literal.val)
    return repr(value.item()) if value.ndim == 0 else f"{value.dtype}{list(value.shape)}"


def _jaxprs_in(value: object) -> Iterator[core.Jaxpr]:
    for item in value if isinstance(value, (tuple, list)) else (value,):
        if isinstance(item, core.ClosedJaxpr):
            yield item.jaxpr
        elif isinstance(item, core.Jaxpr):
            yield item


def _masked(value: object) -> str:
    """A parameter's text with addresses and integers masked: shapes, sizes and offsets may differ."""
    return _INTEGER.sub("#", _ADDRESS.sub("@", repr(value)))


def xla_equations(jaxpr: core.Jaxpr) -> list[core.JaxprEqn]:
    """The equations of the XLA code around the kernels in execution order, sub-programs inlined."""
    found: list[core.JaxprEqn] = []
    for eqn in jaxpr.eqns:
        found.append(eqn)
        if eqn.primitive.name == "pallas_call":
            continue
        for _, sub in sub_jaxprs(eqn):
            found.extend(xla_equations(sub))
    return found


def _named(eqn: core.JaxprEqn, filename: str) -> str:
    """``mul (candidate line 12)``: an equation's primitive and, when known, the candidate line that made it."""
    line = eqn_line(eqn, filename) if filename else None
    return eqn.primitive.name + (f" (candidate line {line})" if line is not None else "")


def _xla_difference(priced: core.Jaxpr, checked: core.Jaxpr, filename: str) -> str | None:
    a, b = xla_equations(priced), xla_equations(checked)
    for index, (x, y) in enumerate(zip(a, b)):
        if x.primitive.name != y.primitive.name:
            return (f"XLA code around the kernels differs: primitive {index + 1} is {_named(x, filename)} "
                    f"at full size but {_named(y, filename)} at "
                    "the check size (a branch on shape)")
    if len(a) != len(b):
        return (f"XLA code around the kernels differs: {len(a)} primitives at full size but {len(b)} at the check "
                "size (a branch on shape)")
    return None
