"""Plain-JAX work (references, non-Pallas candidates, the glue around kernels) priced from XLA.

Approximation, stated once: HBM bytes are the "bytes accessed" of XLA's cost analysis of the program
compiled for *this CPU* (``jax.jit(f).lower(*shapes).compile().cost_analysis()``), i.e. after CPU fusion;
XLA:TPU fuses differently and may keep a bf16 matmul's operands in bf16 where the CPU widens them, so bytes
are indicative, not exact. XLA counts a loop body once; here work and bytes are charged per trip, with trip
counts evaluated on the task's small integer inputs (``program_records``). Work (MXU/VPU/EUP) is counted from the jaxpr
with the same rules as kernel bodies (``maxkernel.targets.ops``), because the CPU's flop count expands some
ops (``ragged_dot`` becomes one dense matmul per group); XLA's own figure is kept for reference.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import core
from jax._src.interpreters import mlir as _mlir
from jax._src import pjit as _pjit
from jax._src.interpreters import pxla as _pxla
from jax._src.random import threefry2x32 as _threefry

from jaxbench.task import Task
from maxkernel.targets.control import UNKNOWN, Interpreter, Path, has_sites, site_name
from maxkernel.targets.interpret import evaluate
from maxkernel.targets.jaxpr_walk import CALL_PRIMITIVES, PallasCall, sub_jaxprs
from maxkernel.targets.ops import OpCounts, UnboundedLoopError, count_ops
from maxkernel.targets.prefetch import pricing_key
from maxkernel.targets.xla_tpu import CompiledCost, program_cost, tpu_compiler


@dataclass
class XlaCost:
    bytes: float
    counts: OpCounts
    xla_flops: float
    tpu: CompiledCost | None = None  # XLA:TPU's own compiled figures, where the TPU compiler is installed
    refused: str | None = None  # why XLA:TPU, installed, did not compile the program (the fallback priced it)


def _compiled(closed: core.ClosedJaxpr, records: dict[Path, Any], device: Any) -> CompiledCost | str:
    """XLA:TPU's figures for the program, or why it would not compile it: a program that needs more HBM than
    the chip has (a reference that materializes its attention scores at a long sequence) is still priced,
    by the fallback roofline, never a failed session."""
    try:
        return program_cost(closed, records, device)
    except Exception as exc:  # XLA:TPU's own refusal (RESOURCE_EXHAUSTED, an op it does not lower)
        return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:240]}"


@contextmanager
def tpu_lowerings() -> Iterator[None]:
    """Lower for this CPU's cost analysis as JAX lowers for a TPU where the two differ in HBM traffic.

    ``threefry2x32`` (every ``jax.random`` draw): JAX lowers it for TPU unrolled (XLA fuses the five rounds
    with the draw's consumers into one loop fusion: the bytes are the draw's output) but for CPU as a
    rolled loop, whose two u32 state arrays the CPU cost analysis counts as read and written each round:
    about 60 bytes an element where the TPU program moves 1 to 4 (a dropout mask of 4096 x 8192 is 1.9 GB
    rolled against 34 MB unrolled). JAX caches a program's lowering whatever the rules were, so the cache is
    emptied on the way in (a program lowered earlier for running here) and out (lowered here for pricing)."""
    table = _mlir._platform_specific_lowerings["cpu"]
    saved = table.get(_threefry.threefry2x32_p)
    _clear_lowerings()
    _mlir.register_lowering(_threefry.threefry2x32_p, _threefry._threefry2x32_lowering_rule, platform="cpu")
    try:
        yield
    finally:
        if saved is None:
            table.pop(_threefry.threefry2x32_p, None)
        else:
            table[_threefry.threefry2x32_p] = saved
        _clear_lowerings()


def _clear_lowerings() -> None:
    _pjit._pjit_lower.cache_clear()
    _pxla._cached_lowering_to_hlo.cache_clear()


def _cost_analysis(traced: Any) -> tuple[float, float]:
    with tpu_lowerings():
        analysis = traced.lower().compile().cost_analysis()
    if isinstance(analysis, (list, tuple)):
        analysis = analysis[0] if analysis else {}
    analysis = analysis or {}
    nbytes = float(analysis.get("bytes accessed", 0.0)) - widening_bytes(traced.jaxpr.jaxpr)
    return max(nbytes, 0.0), float(analysis.get("flops", 0.0))


def widening_bytes(jaxpr: core.Jaxpr) -> float:
    """Bytes XLA:CPU adds to a 16-bit matmul with a 16-bit result that XLA:TPU does not move.

    XLA:CPU runs such a dot in f32: it converts each operand (read 2 bytes, write 4 per element), reads the
    f32 copies, writes an f32 result and converts it back (10 bytes per element of each operand and of the
    result); XLA:TPU feeds the MXU bf16 and writes bf16 (2 bytes). A dot asked for an f32 result
    (``preferred_element_type``) is not widened. Each dot in the program text counts once, as in XLA's own
    cost analysis."""
    extra = 0.0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            avals = [v.aval for v in (*eqn.invars[:2], eqn.outvars[0])]
            if all(np.dtype(a.dtype).itemsize == 2 and jnp.issubdtype(a.dtype, jnp.floating) for a in avals):
                extra += 8.0 * sum(float(np.prod(a.shape)) for a in avals)
        elif eqn.primitive.name != "pallas_call":
            extra += sum(widening_bytes(sub) for _, sub in sub_jaxprs(eqn))
    return extra


Known = Callable[[], Sequence[Any]]  # concrete small integer inputs (UNKNOWN elsewhere), drawn when needed


def xla_cost(fn: Callable[..., Any], arg_shapes: Sequence[Any], known: Known | None = None,
             tpu_generation: str | None = None) -> XlaCost:
    """Bytes and work of ``fn`` (plain JAX) at the given abstract argument shapes. ``known()`` gives concrete
    values of the small integer arguments, from which loop trip counts are evaluated (only if there is a
    loop or branch to resolve). With ``tpu_generation`` and the TPU compiler installed, the program is also
    compiled for that generation and XLA:TPU's own figures come with it (``tpu``); the CPU bytes are then
    not computed."""
    traced = jax.jit(fn).trace(*arg_shapes)
    closed = traced.jaxpr
    records = program_records(closed, known or (lambda: [UNKNOWN] * len(closed.in_avals)))
    counts = count_ops(closed.jaxpr, records)
    device = tpu_compiler(tpu_generation) if tpu_generation else None
    tpu = _compiled(closed, records, device) if device is not None else None
    if isinstance(tpu, CompiledCost):
        return XlaCost(tpu.bytes, counts, tpu.flops, tpu)
    nbytes, xla_flops = _cost_analysis(traced)
    return XlaCost(nbytes + loop_bytes(closed.jaxpr, records), counts, xla_flops, refused=tpu)


def loop_bytes(jaxpr: core.Jaxpr, records: dict[Path, Any], path: Path = ()) -> float:
    """Bytes of the loop trips XLA's cost analysis leaves out: it counts a ``while``/``scan`` body once, so
    each top-level loop adds (trips - 1) times its body's own bytes (loops nested in a body stay counted
    once per trip of the outer one)."""
    extra = 0.0
    for position, eqn in enumerate(jaxpr.eqns):
        here, name = (*path, position), eqn.primitive.name
        called = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
        if name in ("while", "scan"):
            record = records.get(here)
            trips = float(eqn.params["length"]) if record is None else float(np.sum(record))
            if trips > 1:
                body = eqn.params["body_jaxpr" if name == "while" else "jaxpr"]
                shapes = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in body.jaxpr.invars]
                extra += (trips - 1) * _cost_analysis(jax.jit(core.jaxpr_as_fun(body)).trace(*shapes))[0]
        elif name in CALL_PRIMITIVES and isinstance(called, core.ClosedJaxpr):
            extra += loop_bytes(called.jaxpr, records, (*here, 0))
    return extra


XLA_SMALL = 1 << 16  # largest value (elements) the control interpreter computes in plain-JAX code


def program_records(closed: core.ClosedJaxpr, known: Known) -> dict[Path, Any]:
    """Branch counts and loop trips of a plain-JAX program, evaluated on the known (small) inputs."""
    if not has_sites(closed.jaxpr):
        return {}
    flat = jax.tree_util.tree_leaves(list(known()), is_leaf=lambda x: x is UNKNOWN)
    slots = [i for i, v in enumerate(flat) if v is not UNKNOWN]

    def run(values: list[Any]) -> dict[Path, Any]:
        args = [UNKNOWN] * len(closed.jaxpr.invars)
        for i, v in zip(slots, values):
            args[i] = v
        interp = Interpreter(small=XLA_SMALL)
        interp.run(closed.jaxpr, closed.consts, args, ())
        return interp.records

    return {k: np.asarray(v) for k, v in jax.jit(run)([flat[i] for i in slots]).items()}


def small_inputs(task: Task, arg_shapes: Sequence[Any]) -> list[Any]:
    """The task's ``full`` inputs that are small integer arrays (group sizes, page tables, lengths), drawn
    with the model's seed; UNKNOWN for every other input (nothing large is materialised)."""
    leaves = jax.tree_util.tree_leaves(arg_shapes)
    wanted = [i for i, a in enumerate(leaves)
              if np.issubdtype(a.dtype, np.integer) and int(np.prod(a.shape)) <= XLA_SMALL]
    if not wanted:
        return [UNKNOWN] * len(leaves)

    def draw(key: jax.Array) -> list[Any]:
        args, _ = task.get_inputs(key, "full")
        flat = jax.tree_util.tree_leaves(args)
        return [flat[i] for i in wanted]

    values = dict(zip(wanted, (np.asarray(v) for v in jax.jit(draw)(pricing_key()))))
    return [values.get(i, UNKNOWN) for i in range(len(leaves))]


LAYOUT_ONLY = ("reshape", "squeeze", "expand_dims")


def glue_cost(closed: core.ClosedJaxpr, calls: list[PallasCall], known: Known | None = None,
              tpu_generation: str | None = None) -> XlaCost:
    """Bytes and work of everything outside the pallas_calls, wherever it sits.

    The program is re-traced with each kernel's outputs turned into inputs and each kernel's computed
    operands turned into outputs, so XLA prices exactly the surrounding code. A loop or branch that holds a
    kernel is taken out the same way and priced on its own (:func:`_flow_cost`): its body's code around the
    kernels times its trips, a branch at its counted or dearer side. ``calls`` is kept for callers' sake.
    """
    return _region_cost(closed, known, tpu_generation)


def _region_cost(closed: core.ClosedJaxpr, known: Known | None, tpu_generation: str | None = None) -> XlaCost:
    """The code of ``closed`` outside its kernels and outside the loops and branches that hold kernels,
    plus each of those priced by :func:`_flow_cost`."""
    held = _held_flows(closed.jaxpr)
    records = program_records(closed, known or (lambda: [UNKNOWN] * len(closed.in_avals))) if held else {}
    hoisted = _hoisted(closed.jaxpr, ())
    outs_of = [[jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in eqn.outvars] for eqn, _ in hoisted]
    arg_shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in closed.in_avals]
    hooked = {id(eqn) for eqn, _ in hoisted}

    def glue(args: list[Any], hoisted_outs: list[list[Any]]) -> list[Any]:
        sources = {id(x) for x in jax.tree_util.tree_leaves((args, hoisted_outs))}
        results = iter(hoisted_outs)
        kept: dict[int, Any] = {}

        def on_layout(eqn: core.JaxprEqn, invals: list[Any]) -> list[Any]:
            # A reshape of a program input or kernel output is a bitcast on TPU: it moves no bytes,
            # so its result counts as the same buffer rather than as a new one to price.
            params = eqn.primitive.get_bind_params(eqn.params)
            out = eqn.primitive.bind(*invals, **params)
            if id(invals[0]) in sources:
                sources.add(id(out))
            return [out]

        def keep(values: Sequence[Any]) -> None:
            for value in values:
                if isinstance(value, jax.core.Tracer) and id(value) not in sources:
                    kept.setdefault(id(value), value)

        def on_hoisted(eqn: core.JaxprEqn, invals: list[Any]) -> list[Any]:
            if id(eqn) not in hooked:  # a loop or branch with no kernel inside: ordinary XLA code
                params = eqn.primitive.get_bind_params(eqn.params)
                out = eqn.primitive.bind(*invals, **params)
                return list(out) if eqn.primitive.multiple_results else [out]
            keep(invals)
            return list(next(results))

        hooks = {"pallas_call": on_hoisted, "while": on_hoisted, "scan": on_hoisted, "cond": on_hoisted,
                 **{name: on_layout for name in LAYOUT_ONLY}}
        keep(evaluate(closed.jaxpr, closed.consts, args, hooks))
        return list(kept.values())

    total = XlaCost(0.0, OpCounts(), 0.0)
    traced = jax.jit(glue).trace(arg_shapes, outs_of)
    if traced.jaxpr.jaxpr.eqns:
        n_outs = sum(len(outs) for outs in outs_of)

        def inputs() -> list[Any]:
            return [*(known() if known is not None else [UNKNOWN] * len(arg_shapes)), *[UNKNOWN] * n_outs]

        inner = program_records(traced.jaxpr, inputs)
        counts = count_ops(traced.jaxpr.jaxpr, inner)
        device = tpu_compiler(tpu_generation) if tpu_generation else None
        tpu = _compiled(traced.jaxpr, inner, device) if device is not None else None
        if isinstance(tpu, CompiledCost):
            total = XlaCost(tpu.bytes, counts, tpu.flops, tpu)
        else:
            nbytes, xla_flops = _cost_analysis(traced)
            total = XlaCost(nbytes + loop_bytes(traced.jaxpr.jaxpr, inner), counts, xla_flops, refused=tpu)
    for eqn, path in hoisted:
        if eqn.primitive.name != "pallas_call":
            _add(total, _flow_cost(eqn, records.get(path), tpu_generation))
    return total


def _add(total: XlaCost, part: XlaCost, times: float = 1.0) -> None:
    total.bytes += times * part.bytes
    total.counts.add(part.counts, times)
    total.xla_flops += times * part.xla_flops
    if part.tpu is not None:  # XLA:TPU's figures add up the same way, where the TPU compiler priced both
        base = total.tpu or CompiledCost(0.0, 0.0, 0.0, 0)
        total.tpu = CompiledCost(base.seconds + times * part.tpu.seconds, base.bytes + times * part.tpu.bytes,
                                 base.flops + times * part.tpu.flops, max(base.temp_bytes, part.tpu.temp_bytes))


def _flow_cost(eqn: core.JaxprEqn, record: Any, tpu_generation: str | None = None) -> XlaCost:
    """A loop or branch that holds a kernel: its body's code around the kernels times its trips (a ``while``
    whose trips the model cannot bound is refused), a branch weighted by how often each side runs where the
    predicate is known, else at its dearer side. Values inside the body are priced as unknown."""
    name = eqn.primitive.name
    total = XlaCost(0.0, OpCounts(), 0.0)
    if name == "cond":
        branches = [_region_cost(b, None, tpu_generation) for b in eqn.params["branches"]]
        if record is not None:
            for j, branch in enumerate(branches):
                _add(total, branch, float(np.sum(np.asarray(record)[..., j])))
        else:
            _add(total, max(branches, key=lambda c: c.bytes + c.counts.flops))
        return total
    if name == "scan":
        _add(total, _region_cost(eqn.params["jaxpr"], None, tpu_generation), float(eqn.params["length"]))
        return total
    if record is None:
        raise UnboundedLoopError(f"a while loop holding a kernel at {site_name(eqn)} has a trip count the model "
                                 "cannot bound from the task's inputs; it is refused rather than priced once")
    trips = float(np.sum(record))
    _add(total, _region_cost(eqn.params["body_jaxpr"], None, tpu_generation), trips)
    _add(total, _region_cost(eqn.params["cond_jaxpr"], None, tpu_generation), trips + 1.0)
    return total


def _holds_kernel(eqn: core.JaxprEqn) -> bool:
    return any(e.primitive.name == "pallas_call" or _holds_kernel(e)
               for _, sub in sub_jaxprs(eqn) for e in sub.eqns)


def _held_flows(jaxpr: core.Jaxpr) -> bool:
    return any(eqn.primitive.name in ("while", "scan", "cond") and _holds_kernel(eqn) for eqn, _ in _hoisted(jaxpr, ()))


def _hoisted(jaxpr: core.Jaxpr, path: Path) -> list[tuple[core.JaxprEqn, Path]]:
    """The kernels, and the loops and branches holding kernels, that :func:`evaluate` meets in ``jaxpr`` (calls
    inlined), in order, with the path :class:`Interpreter` gives them."""
    found: list[tuple[core.JaxprEqn, Path]] = []
    for position, eqn in enumerate(jaxpr.eqns):
        here, name = (*path, position), eqn.primitive.name
        called = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
        if name == "pallas_call" or (name in ("while", "scan", "cond") and _holds_kernel(eqn)):
            found.append((eqn, here))
        elif name in CALL_PRIMITIVES and isinstance(called, core.ClosedJaxpr):
            found.extend(_hoisted(called.jaxpr, (*here, 0)))
    return found
