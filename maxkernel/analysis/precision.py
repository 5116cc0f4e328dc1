"""How many bf16 MXU passes a task's float32 matmuls need to meet its tolerance, decided by the computation.

A TPU multiplies float32 operands in one bf16 pass (default precision), three (the bf16 split, ``HIGH``) or
six (``HIGHEST``). Which is enough is a property of the computation and the tolerance, not of the precision
the reference happened to write: a default-precision product whose task asks 1e-2 may need three passes,
a ``HIGHEST`` one whose task asks 1e-1 needs one. :func:`precision_need` runs the reference with every
float32 MXU equation forced into each class (``jaxbench.tpu_numerics``) on the evaluator's kinds of input
(a draw and its shifted set) and compares each with the exact float32 result (what the evaluator judges
against) at the task's tolerance. Rounding error grows with the contraction, so it runs where the kernel is
priced: every size parameter at its ``full`` value except the free ones (rows, batch, tokens), which are
taken down until the run costs at most ``FLOP_BUDGET`` (``cpu`` size when even that is too large).

The rule (:func:`admitted_passes`): one pass where its worst error is within ``ONE_PASS_ROOM`` of the
tolerance (the operands' rounding, not the order of the sums, makes one pass's error, so a kernel makes the
reference's; a one-pass kernel found outside is retried at three, ``tpu_gemm.retry_split``); else three passes where they meet the tolerance, with six as the retry the rules debugger
makes for a three-pass kernel found just outside (``tpu_gemm.retry_precise``); else six.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from jaxbench.task import Task

PASSES = {"bf16": 1, "f32_high": 3, "f32": 6}  # bf16 passes per float32 product of each MXU class
PRECISION_NAME = {1: "one bf16 pass (default precision)", 3: "three bf16 passes (HIGH)", 6: "six bf16 passes (HIGHEST)"}
# A one-pass kernel is chosen only when the reference at one pass uses at most this share of the tolerance: the
# analysis runs fewer rows than a check does, and the largest error grows with the elements drawn (about 20%
# from 1e5 to 1e7 normal draws); a kernel that still lands outside is retried at three passes.
ONE_PASS_ROOM = 0.8
SEEDS = (0,)
FLOP_BUDGET = 2e9  # per run of the reference at the analysis size (six runs per task)
BYTE_BUDGET = 128 << 20  # of one input set at the analysis size


@dataclass(frozen=True)
class PrecisionNeed:
    """The reference's float32 matmuls at each pass count: its worst error as a share of the tolerance
    (``ratios[passes]``: max of |out - exact| / (atol + rtol |exact|); at most 1.0 passes), the class its own
    precision asks for, and the pass counts a kernel may use."""

    task: str
    f32_matmuls: int  # float32 MXU equations in the reference (0: precision is not a question)
    own_passes: int  # what the reference's own precision computes on a TPU (the most of its equations)
    ratios: dict[int, float] = field(default_factory=dict)
    atol: float = 0.0
    rtol: float = 0.0

    @property
    def passes(self) -> int:
        """The fewest passes a kernel uses (:func:`admitted_passes`' first)."""
        return admitted_passes(self)[0]

    @property
    def own_misses(self) -> bool:
        """The reference itself, computed as a TPU computes it, misses its own tolerance."""
        return bool(self.f32_matmuls) and self.ratios.get(self.own_passes, 0.0) > 1.0

    def describe(self) -> str:
        """One line: the reference's own error on the TPU against the tolerance, and which precision passes."""
        own = self.ratios.get(self.own_passes, 0.0)
        passing = [p for p in sorted(self.ratios) if self.ratios[p] <= 1.0]
        which = PRECISION_NAME[passing[0]] if passing else "no MXU precision"
        return (f"the reference computed as on a TPU ({PRECISION_NAME[self.own_passes]}) misses its own tolerance "
                f"(atol {self.atol:g}, rtol {self.rtol:g}): its worst error is {own:.3g} times what the tolerance "
                f"allows; {which} passes ({_shares(self.ratios)}); candidates are judged against the exact result "
                f"at the task's tolerance, and the reference's modelled time stays the baseline")


def _shares(ratios: dict[int, float]) -> str:
    return ", ".join(f"{p} pass{'es' if p > 1 else ''}: {r:.3g}x" for p, r in sorted(ratios.items()))


def admitted_passes(need: PrecisionNeed) -> list[int]:
    """The pass counts a kernel's float32 products may use, the fewest first (module doc)."""
    if not need.f32_matmuls:
        return [1]
    if need.ratios.get(1, np.inf) <= ONE_PASS_ROOM:
        return [1]
    if need.ratios.get(3, np.inf) <= 1.0:
        return [3, 6]
    return [6]


def kernel_passes(task: "Task") -> int:
    """The fewest bfloat16 passes a kernel's float32 products may use for ``task``; six where the reference
    cannot be run at the analysis size to tell."""
    try:
        return admitted_passes(precision_need(task))[0]
    except Exception:  # the reference cannot be run at the analysis size: keep its precision exact
        return 6


_cache: dict[tuple[Any, ...], PrecisionNeed] = {}
_lock = threading.Lock()


def precision_need(task: "Task", size: str | None = None) -> PrecisionNeed:
    """The task's :class:`PrecisionNeed` at ``size`` (by default :func:`analysis_size`'s), computed once per
    process per task, sizes and tolerance."""
    tol = task.spec.tolerance
    sizes = {k: v for k, v in task.spec.sizes.items() if k in ("cpu", "full") or k == size}  # not derived ones
    key = (str(task.path), task.source_digest, size, repr(sorted((k, sorted(v.items())) for k, v in sizes.items())),
           repr(sorted((k, f.model_dump_json()) for k, f in task.spec.free.items())), tol.atol, tol.rtol)
    with _lock:
        found = _cache.get(key)
    if found is None:
        if size is None:
            task, size = analysis_size(task)
        found = _measure(task, size)
        with _lock:
            _cache[key] = found
    return found


def analysis_size(task: "Task") -> tuple["Task", str]:
    """(task, size name) where the need is measured: ``full`` with the free parameters taken down (module doc)."""
    full, cpu = task.spec.sizes.get("full"), task.spec.sizes["cpu"]
    if not full or not task.spec.free:
        return task, "cpu"
    values = dict(full)
    for name, free in task.spec.free.items():
        values[name] = min(int(full[name]), int(cpu.get(name, full[name])))
    while True:
        cost = _cost(task.with_size("precision", values))
        if cost is None:
            return task, "cpu"
        flops, nbytes = cost
        if flops <= FLOP_BUDGET and nbytes <= BYTE_BUDGET:
            return task.with_size("precision", values), "precision"
        smaller = dict(values)
        for name, free in task.spec.free.items():
            step = free.multiple_of
            floor = max(free.min, step)
            smaller[name] = max(floor, (int(values[name]) // 2) // step * step)
        if smaller == values:
            return task, "cpu"
        values = smaller


def _cost(task: "Task") -> tuple[float, float] | None:
    """(FLOPs of the reference, bytes of one input set) at size ``precision``, or None when it does not trace."""
    import jax

    from jaxbench.task_check import full_shapes

    try:
        args, static, _ = full_shapes(task, "precision")
        analysis = jax.jit(partial(task.reference, **static)).lower(*args).cost_analysis()
    except Exception:
        return None
    if isinstance(analysis, list):
        analysis = analysis[0] if analysis else {}
    nbytes = sum(int(np.prod(a.shape, dtype=np.int64)) * np.dtype(a.dtype).itemsize for a in jax.tree_util.tree_leaves(args))
    return float((analysis or {}).get("flops", 0.0)), float(nbytes)


def _ratio(expected: Any, actual: Any, atol: float, rtol: float) -> float:
    from jaxbench.compare import tree_leaves

    worst = 0.0
    for e, a in zip(tree_leaves(expected), tree_leaves(actual)):
        e64, a64 = np.asarray(e, np.float64), np.asarray(a, np.float64)
        if not np.all(np.isfinite(a64) == np.isfinite(e64)):
            return float("inf")
        both = np.isfinite(e64)
        if both.any():
            err = np.abs(a64[both] - e64[both]) / (atol + rtol * np.abs(e64[both]))
            worst = max(worst, float(np.max(err)))
    return worst


def _measure(task: "Task", size: str) -> PrecisionNeed:
    import jax

    from jaxbench.evaluate import shifted
    from jaxbench.tpu_numerics import MXU_CLASSES, _class_of, computed_as_on_tpu

    tol = task.spec.tolerance
    sets = [[np.asarray(a) for a in task.get_inputs(jax.random.key(s), size)[0]] for s in SEEDS]
    sets.append(shifted(sets[0]))
    _, static = task.get_inputs(jax.random.key(SEEDS[0]), size)
    fn = partial(task.reference, **static)
    closed = jax.make_jaxpr(fn)(*sets[0])
    classes = [c for c in _classes(closed.jaxpr, _class_of) if c != "int8"]
    if not classes:
        return PrecisionNeed(task.id, 0, 1, {}, tol.atol, tol.rtol)
    own = max(PASSES[c] for c in classes)
    exact = jax.jit(fn)
    forced = {cls: jax.jit(computed_as_on_tpu(fn, closed, sets[0], force=cls)[0]) for cls in MXU_CLASSES[:2]}
    ratios = {1: 0.0, 3: 0.0, 6: 0.0}
    for inputs in sets:
        expected = exact(*inputs)
        for cls, run in forced.items():
            ratios[PASSES[cls]] = max(ratios[PASSES[cls]], _ratio(expected, run(*inputs), tol.atol, tol.rtol))
    return PrecisionNeed(task.id, len(classes), own, ratios, tol.atol, tol.rtol)


def _classes(jaxpr: Any, class_of: Any) -> list[str]:
    """The MXU class of every float32 MXU equation of ``jaxpr`` and of the programs nested in it."""
    from jax._src import core

    found: list[str] = []
    for eqn in jaxpr.eqns:
        cls = class_of(eqn)
        if cls is not None:
            found.append(cls)
        for value in eqn.params.values():
            subs = value if isinstance(value, (tuple, list)) else (value,)
            for sub in subs:
                if isinstance(sub, core.ClosedJaxpr):
                    found += _classes(sub.jaxpr, class_of)
                elif isinstance(sub, core.Jaxpr):
                    found += _classes(sub, class_of)
    return found
