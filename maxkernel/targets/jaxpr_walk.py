"""Walking traced programs: sub-jaxprs of an equation, and the pallas_call equations wherever they sit."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from jax._src import core

# Equations that only wrap a sub-program (run once, no control flow): their bodies count as inline code.
CALL_PRIMITIVES = frozenset({"jit", "pjit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call",
                             "custom_vjp_call_jaxpr", "remat", "checkpoint", "custom_lin", "named_call"})


def sub_jaxprs(eqn: core.JaxprEqn) -> Iterator[tuple[str, core.Jaxpr]]:
    """Every (param name, jaxpr) held by an equation's params: bodies, branches, called programs."""
    for key, value in eqn.params.items():
        values = value if isinstance(value, (tuple, list)) else (value,)
        for item in values:
            if isinstance(item, core.ClosedJaxpr):
                yield key, item.jaxpr
            elif isinstance(item, core.Jaxpr):
                yield key, item


@dataclass
class PallasCall:
    """One pallas_call site. ``count`` is how often it runs per program run (scan lengths multiplied)."""

    eqn: core.JaxprEqn
    count: float
    in_control_flow: bool

    @property
    def name(self) -> str:
        dbg = self.eqn.params["jaxpr"].debug_info
        given = self.eqn.params.get("name")
        return str(given or (dbg.func_name if dbg is not None else "pallas_call"))


def find_pallas_calls(jaxpr: core.Jaxpr) -> list[PallasCall]:
    """All pallas_call sites of a program in execution order; cond branches each count as if taken."""
    found: list[PallasCall] = []
    _collect(jaxpr, 1.0, False, found)
    return found


def _collect(jaxpr: core.Jaxpr, count: float, in_flow: bool, found: list[PallasCall]) -> None:
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "pallas_call":
            found.append(PallasCall(eqn, count, in_flow))
            continue
        for key, sub in sub_jaxprs(eqn):
            if name == "scan":
                _collect(sub, count * eqn.params["length"], True, found)
            elif name == "while":
                if key == "body_jaxpr":
                    _collect(sub, count, True, found)
            elif name in CALL_PRIMITIVES:
                _collect(sub, count, in_flow, found)
            else:
                _collect(sub, count, True, found)
