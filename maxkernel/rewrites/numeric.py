"""Subcomputations that provably do nothing: results equal to their own input, or constant.

A value B computed only from one value A (and constants) is evaluated on independent random draws of A.
If B always equals A (a logsumexp over one element, a mean of a single value) it is replaced by A; if B
is always the same constant (``h - mean(h)`` over a size-1 axis: normalization statistics that are
provably constant) it becomes that constant. The draws only nominate a rewrite: the evaluator proves it.

Concrete evaluation runs in the optimizer's own process, so it is bounded: no node whose result has more
than ``MAX_ELEMENTS`` elements is evaluated (at ``full`` size a scalar broadcast to a score tensor would
take gigabytes), and :func:`evaluate_nodes` refuses any batch of nodes whose results would pass
``CONCRETE_BYTES``. Larger programs are only ever traced abstractly.
"""

from __future__ import annotations

import numpy as np

from maxkernel.analysis.program import Const, Node, Program, Var, read
from maxkernel.rewrites.base import Rewrite
from maxkernel.rewrites.build import Splice
from maxkernel.rewrites.emit import EmitError

PLUMBING = {"reshape", "broadcast_in_dim", "convert_element_type", "squeeze", "expand_dims", "copy", "transpose"}
NEVER = {"random_bits", "random_wrap", "random_seed", "random_unwrap", "rng_bit_generator", "while", "scan", "cond", "pallas_call"}
MAX_ELEMENTS = 1 << 21
CONCRETE_BYTES = 256 << 20


class TooLargeToEvaluate(EmitError):
    """Evaluating these nodes concretely would allocate more than ``CONCRETE_BYTES`` in this process."""


def result_bytes(nodes: list[Node]) -> int:
    """Bytes the results of ``nodes`` take once computed (what evaluating them allocates)."""
    return sum(out.size * np.dtype(out.dtype).itemsize for node in nodes for out in node.outs)


def _draws(var: Var, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [
        (rng.standard_normal(var.shape) * 1.7 + 0.3).astype(var.dtype),
        rng.uniform(-4.0, 4.0, var.shape).astype(var.dtype),
        (rng.standard_normal(var.shape) * 1e-4).astype(var.dtype),  # exposes epsilons and offsets
    ]


def _closure(program: Program, a: Var) -> tuple[list[Node], set[Var]]:
    """Nodes computable from ``a`` and constants alone, and the values among them that depend on ``a``."""
    pure: set[Var] = {a}
    dependent: set[Var] = {a}
    found = []
    for node in program.nodes:
        if a in node.outs:
            found, pure, dependent = [], {a}, {a}
            continue
        vars_in = [op for op in node.ins if isinstance(op, Var)]
        small = all(out.size <= MAX_ELEMENTS for out in node.outs)
        if small and all(v in pure for v in vars_in) and node.prim not in NEVER:
            found.append(node)
            pure.update(node.outs)
            if any(v in dependent for v in vars_in):
                dependent.update(node.outs)
    return found, dependent


def evaluate_nodes(nodes: list[Node], bound: dict[Var, np.ndarray]) -> dict[Var, np.ndarray]:
    """Run ``nodes`` (in program order) on concrete values for the vars in ``bound``.

    Raises TooLargeToEvaluate, before computing anything, when the results would pass ``CONCRETE_BYTES``.
    """
    needed = result_bytes(nodes)
    if needed > CONCRETE_BYTES:
        raise TooLargeToEvaluate(f"evaluating {len(nodes)} node(s) here would allocate {needed / 2**20:.0f} MiB "
                                 f"(limit {CONCRETE_BYTES >> 20} MiB); left to abstract tracing")
    env: dict[Var, object] = dict(bound)
    for node in nodes:
        out = node.primitive.bind(*[read(env, op) for op in node.ins], **node.params)
        env.update(zip(node.outs, out if node.primitive.multiple_results else [out]))
    return {k: np.asarray(v) for k, v in env.items()}


def _find(program: Program, a: Var) -> tuple[Node, str, object] | None:
    nodes, dependent = _closure(program, a)
    if not nodes or not any(n.prim not in PLUMBING for n in nodes):
        return None
    if result_bytes(nodes) * 3 > CONCRETE_BYTES:  # three draws are held at once
        return None
    runs = [evaluate_nodes(nodes, {a: d}) for d in _draws(a, 0)]
    for node in reversed(nodes):  # the furthest downstream result first: it removes the most work
        b = node.out
        if len(node.outs) != 1 or b not in dependent or getattr(b.dtype, "kind", None) != "f" or node.prim in PLUMBING:
            continue
        values = [r[b] for r in runs]
        if not all(np.all(np.isfinite(v)) for v in values):
            continue
        if b.size == a.size and all(np.array_equal(v.reshape(-1), r[a].reshape(-1)) for v, r in zip(values, runs)):
            return node, "identity", None
        first = values[0].reshape(-1)[0] if values[0].size else None
        if first is not None and all(np.all(v == first) for v in values):
            return node, "constant", first
    return None


def remove_idle_subgraphs(program: Program) -> int:
    count = 0
    while count < 20:
        change = None
        for a in list(program.inputs) + [o for n in program.nodes for o in n.outs]:
            if getattr(a.dtype, "kind", None) == "f" and 0 < a.size <= MAX_ELEMENTS:
                change = _find(program, a)
                if change is not None:
                    break
        if change is None:
            return count
        node, kind, value = change
        sp = Splice(program)
        if kind == "identity":
            sp.commit(node, sp.reshape(a, node.out.shape))
        else:
            const = Const(np.full(node.out.shape, value, dtype=node.out.dtype), node.out.shape, node.out.dtype, False)
            sp.commit(node, const)
        program.dce()
        count += 1
    return count


IDLE_SUBGRAPHS = Rewrite(
    "idle_subgraphs",
    "subcomputations whose result equals their input, or is constant, removed",
    remove_idle_subgraphs,
)
