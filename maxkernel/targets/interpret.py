"""Re-running a traced program with some primitives answered by hooks, to reach what a CPU cannot run.

The cost model needs things a CPU cannot get by running the candidate: the XLA work around the kernels (the
"glue": casts, reshapes, padding between pallas_calls), the values of scalar-prefetch operands, and the
``pl.when`` predicates of each grid step. All come from re-tracing a program with ``pallas_call`` (or
``program_id``) answered by a hook instead of Mosaic.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from jax._src import core, source_info_util

from maxkernel.targets.jaxpr_walk import CALL_PRIMITIVES

Hook = Callable[[core.JaxprEqn, list[Any]], list[Any]]


def evaluate(jaxpr: core.Jaxpr, consts: Sequence[Any], args: Sequence[Any], hooks: Mapping[str, Hook]) -> list[Any]:
    """Evaluate ``jaxpr`` like ``jax.core.eval_jaxpr``, inlining calls; ``hooks[name]`` answers that primitive
    (given the equation and its input values, it returns the output values)."""
    env: dict[core.Var, Any] = {}

    def read(v: core.Atom) -> Any:
        return v.val if isinstance(v, core.Literal) else env[v]

    for var, val in zip(jaxpr.constvars, consts):
        env[var] = val
    for var, val in zip(jaxpr.invars, args):
        env[var] = val
    for eqn in jaxpr.eqns:
        invals = [read(v) for v in eqn.invars]
        name = eqn.primitive.name
        called = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
        if name in hooks:
            outs = hooks[name](eqn, invals)
        elif name in CALL_PRIMITIVES and isinstance(called, core.ClosedJaxpr):
            outs = evaluate(called.jaxpr, called.consts, invals, hooks)
        else:
            params = eqn.primitive.get_bind_params(eqn.params)
            with source_info_util.user_context(eqn.source_info.traceback), eqn.ctx.manager:
                ans = eqn.primitive.bind(*invals, **params)
            outs = ans if eqn.primitive.multiple_results else [ans]
        for var, val in zip(eqn.outvars, outs):
            env[var] = val
    return [read(v) for v in jaxpr.outvars]


def pallas_dependent_inputs(jaxpr: core.Jaxpr, target: core.JaxprEqn) -> list[bool] | None:
    """For ``target``'s operands: whether each is computed from an earlier pallas_call's output.

    None when ``target`` is not reached through plain calls (it sits in a loop or branch).
    """
    found: list[list[bool]] = []
    _taint(jaxpr, [False] * len(jaxpr.invars), target, found)
    return found[0] if found else None


def _taint(jaxpr: core.Jaxpr, tainted_in: list[bool], target: core.JaxprEqn, found: list[list[bool]]) -> list[bool]:
    tainted: set[core.Var] = {v for v, t in zip(jaxpr.invars, tainted_in) if t}

    def is_tainted(v: core.Atom) -> bool:
        return isinstance(v, core.Var) and v in tainted

    for eqn in jaxpr.eqns:
        flags = [is_tainted(v) for v in eqn.invars]
        called = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
        if eqn is target and not found:
            found.append(flags)
        if eqn.primitive.name == "pallas_call":
            outs = [True] * len(eqn.outvars)
        elif eqn.primitive.name in CALL_PRIMITIVES and isinstance(called, core.ClosedJaxpr):
            outs = _taint(called.jaxpr, flags, target, found)
        else:
            outs = [any(flags)] * len(eqn.outvars)
        tainted.update(v for v, t in zip(eqn.outvars, outs) if t)
    return [is_tainted(v) for v in jaxpr.outvars]
