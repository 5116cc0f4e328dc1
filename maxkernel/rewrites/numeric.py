"""Subcomputations that provably do nothing: results equal to their own input, or constant.

A value B computed only from one value A (and constants) is evaluated on independent random draws of A.
If B always equals A (a logsumexp over one element, a mean of a single value) it is replaced by A; if B
is always the same constant (``h - mean(h)`` over a size-1 axis: normalization statistics that are
provably constant) it becomes that constant. The draws only nominate a rewrite: the evaluator proves it.

Concrete evaluation runs in the optimizer's own process, so it is bounded: no node whose result has more
than ``MAX_ELEMENTS`` elements is evaluated (at ``full`` size a scalar broadcast to a score tensor would
take gigabytes), :func:`evaluate_nodes` refuses any batch of nodes whose results would pass
``CONCRETE_BYTES``, and input-free values that are only needed reduced (attention masks) are computed by
XLA in one compiled program whose buffers are checked against the same limit before it runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from maxkernel.analysis.program import Const, Node, Program, Var, read
from maxkernel.rewrites.base import Rewrite
from maxkernel.rewrites.build import Splice
from maxkernel.rewrites.emit import EmitError

PLUMBING = {"reshape", "broadcast_in_dim", "convert_element_type", "squeeze", "expand_dims", "copy", "transpose"}
NEVER = {"random_bits", "random_wrap", "random_seed", "random_unwrap", "rng_bit_generator", "while", "scan", "cond", "pallas_call"}
MAX_ELEMENTS = 1 << 21
CONCRETE_BYTES = 512 << 20


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


def _computed(nodes: list[Node], var: Var) -> Any:
    """``var`` computed by binding ``nodes`` in order (under a trace: nothing runs yet)."""
    env: dict[Var, object] = {}
    for node in nodes:
        out = node.primitive.bind(*[read(env, op) for op in node.ins], **node.params)
        env.update(zip(node.outs, out if node.primitive.multiple_results else [out]))
    return read(env, var)


def _run_bounded(fn: Callable[[], Any], what: str) -> Any:
    """Compile ``fn`` with XLA and run it, unless its buffers would pass ``CONCRETE_BYTES``."""
    compiled = jax.jit(fn).lower().compile()
    memory = compiled.memory_analysis()
    needed = None if memory is None else memory.temp_size_in_bytes + memory.output_size_in_bytes
    if needed is None or needed > CONCRETE_BYTES:
        shown = "an unknown amount" if needed is None else f"{needed / 2**20:.0f} MiB"
        raise TooLargeToEvaluate(f"evaluating {what} here would take {shown} (limit {CONCRETE_BYTES >> 20} MiB)")
    return jax.tree_util.tree_map(np.asarray, compiled())


def evaluate_reduced(nodes: list[Node], var: Var, finish: Callable[[Any], Any]) -> Any:
    """``finish(value of var)`` for a var computed by ``nodes`` from constants alone, run by XLA as one
    compiled program so that only what ``finish`` returns need be materialized.

    Raises TooLargeToEvaluate, before running, when XLA's buffers for it would pass ``CONCRETE_BYTES``.
    """
    return _run_bounded(lambda: finish(_computed(nodes, var)), f"{var.name} {var.shape}")


def evaluate_any(nodes: list[Node], var: Var, kept: Callable[[Any], Any], steps: int) -> np.ndarray:
    """OR over axis 0 of ``kept(value of var)`` (an array of ``steps`` rows), one row per loop step, so that
    XLA holds one row at a time (a mask over a full-size score tensor reduces to [q, k] without the tensor
    ever existing). Raises TooLargeToEvaluate like :func:`evaluate_reduced`."""

    def run() -> Any:
        def step(i: Any, acc: Any) -> Any:
            return acc | jax.lax.dynamic_index_in_dim(kept(_computed(nodes, var)), i, keepdims=False)

        first = jax.eval_shape(lambda: kept(_computed(nodes, var)))
        return jax.lax.fori_loop(0, steps, step, jnp.zeros(first.shape[1:], bool))

    return np.asarray(_run_bounded(run, f"{var.name} {var.shape}"))


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
