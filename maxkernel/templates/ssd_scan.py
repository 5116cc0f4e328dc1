"""The selective state-space recurrence written as a step-by-step ``lax.scan``, read for the chunked SSD kernel.

Mamba-2 written plainly carries a state ``H [batch, heads, head_dim, state_dim]`` through a scan over time:
``H = decay_t H + (dt_t x_t) B_t^T`` and ``y_t = H C_t``. That is the recurrence ``tpu_ssd`` computes
chunk by chunk, with ``exp(dt A)`` given as the decay. What comes before the scan (a causal convolution,
the split of a packed projection, softplus) and after it stays the reference's own code, run by XLA; the
scan is replaced by the kernel. The scan is found by structure (one scan, one carried state starting at
zero, five stepped operands of the recurrence's shapes) and its operands' roles by a numeric probe: the scan
alone, run on a draw at the ``cpu`` size, against the recurrence in float64 (which also tells ``B`` from
``C`` and ``dt`` from the decay). Where the decay is an ``exp``, the kernel reads its exponent (the log
decay it sums) rather than taking a log of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import permutations
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from maxkernel.analysis.program import Const, Node, Program, Var, run_program, trace_program
from maxkernel.templates.around import Around, cut_around

if TYPE_CHECKING:
    from jaxbench.task import Task

ROLES = ("x", "dt", "decay", "B", "C")
PROBE_TOLERANCE = 1e-3
PASS_LAYOUT = ("transpose",)


@dataclass(frozen=True)
class ScanReading:
    """The scan's stepped operands, by position among them, in ``ROLES`` order."""

    order: tuple[int, ...]


@dataclass
class ScanCut:
    """A reference cut around its scan (``around``): the operands time-major, as the scan steps them."""

    around: Around
    log_given: bool  # the log decay is the exponent the reference takes ``exp`` of (else a log is taken)
    shape: tuple[int, int, int, int, int, int]  # batch, seq, heads, head_dim, groups, state_dim
    precision: str


def _scan(program: Program) -> tuple[int, Node] | str:
    scans = [(i, n) for i, n in enumerate(program.nodes) if n.prim == "scan"]
    if len(scans) != 1:
        return f"{len(scans)} scans (the scan reading takes exactly one)"
    i, node = scans[0]
    p = node.params
    if p["num_carry"] != 1 or p["reverse"] or len(node.ins) - p["num_consts"] - 1 != len(ROLES):
        return "a scan that does not carry one state through five stepped operands"
    return i, node


def _readings(node: Node) -> list[tuple[int, ...]]:
    """Assignments of the stepped operands to ``ROLES`` that the shapes allow: x [s, b, h, p], dt and the
    decay [s, b, h], B and C [s, b, n] or [s, b, g, n] (g dividing h), the state [b, h, p, n]."""
    consts = node.params["num_consts"]
    state = tuple(node.ins[consts].shape)  # type: ignore[union-attr]
    shapes = [tuple(v.shape) for v in node.ins[consts + 1:]]  # type: ignore[union-attr]
    if len(state) != 4:
        return []
    batch, heads, head_dim, n = state
    found = []
    for order in permutations(range(len(ROLES))):
        x, dt, decay, b, c = (shapes[i] for i in order)
        seq = x[0] if x else 0
        grouped = len(b) == 4 and heads % b[2] == 0 and b[:2] == (seq, batch) and b[3] == n
        if x == (seq, batch, heads, head_dim) and dt == decay == (seq, batch, heads) and b == c \
                and (b == (seq, batch, n) or grouped):
            found.append(order)
    return found


def recurrence(x: np.ndarray, dt: np.ndarray, decay: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """``y_t = H_t C_t`` with ``H_t = decay_t H_{t-1} + dt_t x_t B_t^T``, time-major, in float64."""
    seq, batch, heads, head_dim = x.shape
    if b.ndim == 3:
        b, c = b[:, :, None], c[:, :, None]
    rep = heads // b.shape[2]
    h = np.zeros((batch, heads, head_dim, b.shape[3]))
    y = np.zeros_like(x)
    for t in range(seq):
        bt, ct = np.repeat(b[t], rep, axis=1), np.repeat(c[t], rep, axis=1)
        h = decay[t][:, :, None, None] * h + (dt[t][:, :, None] * x[t])[..., None] * bt[:, :, None, :]
        y[t] = np.einsum("bhpn,bhn->bhp", h, ct)
    return y


def _probe(program: Program, node: Node, readings: list[tuple[int, ...]]) -> tuple[int, ...] | None:
    """The reading under which the scan alone, on a draw, is ``recurrence`` (its state starting at zero)."""
    consts = node.params["num_consts"]
    fixed = [op for op in node.ins[:consts + 1] if isinstance(op, Var)]
    if any(program.reads(op) for op in fixed):
        return None
    stepped = [op for op in node.ins[consts + 1:]]
    if not all(isinstance(op, Var) for op in stepped):
        return None
    nodes = sorted({id(n): n for op in fixed for n in program.ancestors(op)}.values(), key=program.nodes.index)
    init = node.ins[consts]
    alone = Program(list(stepped), [*nodes, node], [node.outs[1]])  # type: ignore[arg-type]
    start = Program([], list(nodes), [init])
    if isinstance(init, Var) and np.any(np.asarray(run_program(start, []))) or \
            isinstance(init, Const) and np.any(np.asarray(init.value)):
        return None
    rng = np.random.default_rng(0)
    for order in readings:
        shapes = [tuple(stepped[i].shape) for i in order]  # type: ignore[union-attr]
        x = rng.standard_normal(shapes[0])
        dt = np.log1p(np.exp(rng.standard_normal(shapes[1]) - 2.0))
        decay = np.exp(-dt * rng.uniform(0.1, 4.0, shapes[2]))
        b, c = rng.standard_normal(shapes[3]), rng.standard_normal(shapes[4])
        values = (x, dt, decay, b, c)
        args: list[Any] = [None] * len(ROLES)
        for role, position in enumerate(order):
            args[position] = np.asarray(values[role], np.dtype(stepped[position].dtype))  # type: ignore[union-attr]
        try:
            got = np.asarray(jax.jit(lambda *a: run_program(alone, list(a)))(*args), np.float64)
        except Exception:  # the body reads its operands otherwise: not this reading
            continue
        expected = recurrence(*(np.asarray(a, np.float64) for a in (args[i] for i in order)))
        if got.shape == expected.shape and np.allclose(got, expected, rtol=PROBE_TOLERANCE, atol=PROBE_TOLERANCE):
            return order
    return None


_READ: dict[tuple[str, str], tuple[int, ...] | str] = {}


def reading(task: "Task") -> tuple[int, ...] | str:
    """The scan's roles, probed once per task at its ``cpu`` size, or why it is not the recurrence."""
    key = (str(task.path), task.source_digest)
    if key not in _READ:
        program = trace_program(task, "cpu").dce()
        found = _scan(program)
        if isinstance(found, str):
            _READ[key] = found
        else:
            readings = _readings(found[1])
            if not readings:
                _READ[key] = "a scan whose stepped operands are not shaped x, dt, a decay, B and C"
            else:
                order = _probe(program, found[1], readings)
                _READ[key] = order if order is not None else \
                    "a scan that is not the selective state-space recurrence (its state starting at zero)"
    return _READ[key]


def _log_decay(program: Program, decay: Var) -> tuple[Var, list[Node]] | None:
    """The decay's exponent, moved as the decay is (transposes between the ``exp`` and the scan), with the
    nodes that move it; None when the decay is not an ``exp``."""
    producers = program.producers()
    moves: list[Node] = []
    var = decay
    while (node := producers.get(var)) is not None and node.prim in PASS_LAYOUT:
        moves.append(node)
        var = node.ins[0]  # type: ignore[assignment]
    if node is None or node.prim != "exp" or not isinstance(node.ins[0], Var):
        return None
    exponent: Var = node.ins[0]
    made: list[Node] = []
    for move in reversed(moves):
        out = program.fresh(move.out.shape, exponent.dtype)
        made.append(Node(move.primitive, [exponent], [out], dict(move.params), move.source))
        exponent = out
    return exponent, made


def cut(task: "Task", size: str) -> ScanCut | str:
    """The reference at ``size`` cut around its scan, or why it cannot be."""
    order = reading(task)
    if isinstance(order, str):
        return order
    program = trace_program(task, size).dce()
    found = _scan(program)
    if isinstance(found, str):
        return found
    at, node = found
    if order not in _readings(node):
        return "a scan whose operands are shaped otherwise at another size"
    consts = node.params["num_consts"]
    stepped = [node.ins[consts + 1 + i] for i in order]
    if any(not isinstance(v, Var) or np.dtype(v.dtype) != np.float32 for v in stepped):
        return "a scan over operands that are not float32"
    users = program.users()
    if users.get(node.outs[0]) or any(o is node.outs[0] for o in program.outputs):
        return "the scan's final state is read"
    x, dt, decay, b, c = stepped
    logged = _log_decay(program, decay)  # type: ignore[arg-type]
    extra: list[Node] = []
    if logged is not None:
        decay, extra = logged
    around = cut_around(program, at, at + 1, [x, dt, decay, b, c], [node.outs[1]], extra)  # type: ignore[list-item]
    if isinstance(around, str):
        return around
    seq, batch, heads, head_dim = x.shape  # type: ignore[union-attr]
    groups = int(b.shape[2]) if len(b.shape) == 4 else 1  # type: ignore[union-attr]
    dots = [e for e in node.params["jaxpr"].jaxpr.eqns if e.primitive.name == "dot_general"]
    precision = "HIGHEST" if any("HIGHEST" in str(e.params.get("precision")) for e in dots) else "DEFAULT"
    return ScanCut(around, logged is not None,
                   (int(batch), int(seq), int(heads), int(head_dim), groups, int(b.shape[-1])), precision)  # type: ignore[union-attr]
