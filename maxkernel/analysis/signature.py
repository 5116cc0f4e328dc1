"""The structural signature of a task: what its reference computes, as seen in its jaxpr.

Two tasks that do the same kind of work (a matmul followed by an elementwise epilogue, a row-wise
normalization, a masked softmax) have overlapping signatures even when their names, sizes and code
differ. The memory embeds these signatures so that recall finds kernels for *similar* work, not only
for the same task id.

The reference is traced at ``cpu`` size on abstract inputs (``jax.eval_shape`` then
``jax.make_jaxpr``): no array is allocated and nothing runs.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

if TYPE_CHECKING:
    from jaxbench.task import Task

# Wrappers whose body is inlined into the sequence: whether a user wrapped code in jit or a
# custom derivative does not change what it computes.
INLINED = frozenset(
    {
        "jit",
        "pjit",
        "closed_call",
        "core_call",
        "custom_jvp_call",
        "custom_vjp_call",
        "custom_vjp_call_jaxpr",
        "custom_lin",
        "remat",
        "checkpoint",
        "remat2",
    }
)

# Data movement and bookkeeping that every computation has: kept out of the sequence so that
# n-grams describe the arithmetic (dot_general > add > max), not the reshapes between it.
PLUMBING = frozenset(
    {
        "broadcast_in_dim",
        "reshape",
        "squeeze",
        "expand_dims",
        "convert_element_type",
        "transpose",
        "stop_gradient",
        "copy",
        "copy_p",
        "sharding_constraint",
        "mesh_cast",
        "reshard",
        "pvary",
        "optimization_barrier",
    }
)

# Names of wrapped functions that say nothing about the computation.
_ANONYMOUS = frozenset({"<lambda>", "reference", "fn", "f", "inner", "wrapped", "_where", "_reduce_sum"})

NGRAM_WEIGHTS: dict[int, float] = {1: 1.0, 2: 1.0, 3: 0.7}

# Primitives that decide how a kernel is built (tiling of a contraction, a reduction axis, a scan):
# weighted up, so that "matmul + any epilogue" stays closer to other matmuls than to a norm.
ANCHORS = frozenset(
    {
        "dot_general",
        "ragged_dot_general",
        "conv_general_dilated",
        "reduce_sum",
        "reduce_max",
        "reduce_min",
        "argmax",
        "argmin",
        "cumsum",
        "cumlogsumexp",
        "scan",
        "while",
        "cond",
        "gather",
        "scatter",
        "scatter-add",
        "sort",
        "top_k",
    }
)
ANCHOR_WEIGHT = 1.5


class SignatureError(Exception):
    """The reference of a task cannot be traced into a jaxpr."""


class TensorSpec(BaseModel):
    shape: list[int]
    dtype: str


class TaskSignature(BaseModel):
    """What a reference computes, independent of its name and code."""

    task_id: str = ""
    category: str | None = None
    size: str = "cpu"
    primitives: list[str] = Field(default_factory=list, description="compute primitives in program order")
    calls: list[str] = Field(default_factory=list, description="names of wrapped functions (relu, gelu, ...)")
    inputs: list[TensorSpec] = Field(default_factory=list)
    outputs: list[TensorSpec] = Field(default_factory=list)
    shape_class: str = ""

    def ngrams(self, n: int) -> Counter[str]:
        """Counts of the ``n``-grams of the primitive sequence, joined by ``>``."""
        seq = self.primitives
        return Counter(">".join(seq[i : i + n]) for i in range(len(seq) - n + 1))

    def features(self) -> dict[str, float]:
        """Weighted sparse features: the input of the structural embedding.

        Counts are damped (1 + log c) so that a long unrolled chain does not drown the rest.
        """
        feats: dict[str, float] = {}
        for n, weight in NGRAM_WEIGHTS.items():
            for gram, count in self.ngrams(n).items():
                feats[f"p{n}:{gram}"] = weight * (1.0 + math.log(count))
        for prim in set(self.primitives) & ANCHORS:
            feats[f"anchor:{prim}"] = ANCHOR_WEIGHT
        if self.primitives:
            feats[f"head:{self.primitives[0]}"] = ANCHOR_WEIGHT
        for name in set(self.calls):
            feats[f"fn:{name}"] = 1.0
        if self.category:
            feats[f"cat:{self.category}"] = 2.0
        if self.shape_class:
            feats[f"shape:{self.shape_class}"] = 1.0
        for spec in self.outputs[:1]:
            feats[f"dtype:{spec.dtype}"] = 0.5
        return feats

    @property
    def pattern(self) -> str:
        """A short human-readable op pattern: the distinct compute primitives in first-use order."""
        seen: list[str] = []
        for prim in self.primitives:
            if prim not in seen:
                seen.append(prim)
        return ">".join(seen[:8])


def _sub_jaxprs(value: Any) -> Iterator[Any]:
    """Jaxprs held in an equation parameter (pjit's ``jaxpr``, cond's ``branches``, ...)."""
    if hasattr(value, "eqns"):
        yield value
    elif hasattr(value, "jaxpr") and hasattr(value.jaxpr, "eqns"):
        yield value.jaxpr
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _sub_jaxprs(item)


def walk_primitives(jaxpr: Any, primitives: list[str], calls: list[str]) -> None:
    """Append the compute primitives of ``jaxpr`` (sub-jaxprs inlined) in program order."""
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        call_name = eqn.params.get("name")
        if isinstance(call_name, str) and call_name not in _ANONYMOUS and not call_name.startswith("_"):
            calls.append(call_name)
        if name not in INLINED and name not in PLUMBING:
            primitives.append(name)
        for param in eqn.params.values():
            for sub in _sub_jaxprs(param):
                walk_primitives(sub, primitives, calls)


def shape_class(inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]) -> str:
    """A coarse class of the shapes: ranks in and out, and the output size as a power of 16.

    Coarse on purpose: a 4096x4096 and a 2048x8192 matmul are the same class of problem.
    """
    ranks_in = ",".join(str(len(s.shape)) for s in inputs)
    ranks_out = ",".join(str(len(s.shape)) for s in outputs)
    elems = max((math.prod(s.shape) for s in outputs), default=1)
    bucket = int(math.log(max(elems, 1), 16))
    return f"{ranks_in}->{ranks_out}:e{bucket}"


def _spec(aval: Any) -> TensorSpec:
    return TensorSpec(shape=[int(d) for d in getattr(aval, "shape", ())], dtype=str(getattr(aval, "dtype", "")))


def trace_signature(
    fn: Callable[..., Any],
    abstract_args: Sequence[Any],
    *,
    task_id: str = "",
    category: str | None = None,
    size: str = "cpu",
) -> TaskSignature:
    """Signature of ``fn`` traced on abstract arguments (``jax.ShapeDtypeStruct`` or arrays)."""
    import jax

    try:
        closed = jax.make_jaxpr(fn)(*abstract_args)
    except Exception as exc:
        where = task_id or getattr(fn, "__name__", "function")
        raise SignatureError(f"{where}: cannot trace the reference: {type(exc).__name__}: {exc}") from exc
    primitives: list[str] = []
    calls: list[str] = []
    walk_primitives(closed.jaxpr, primitives, calls)
    inputs = [_spec(v.aval) for v in closed.jaxpr.invars]
    outputs = [_spec(v.aval) for v in closed.jaxpr.outvars]
    return TaskSignature(
        task_id=task_id,
        category=category,
        size=size,
        primitives=primitives,
        calls=calls,
        inputs=inputs,
        outputs=outputs,
        shape_class=shape_class(inputs, outputs),
    )


def check_reference(task: Task) -> None:
    """Raise TaskError or SignatureError, in one line, unless the task's reference imports, draws its inputs
    and traces at the cpu size: what every door (the CLI, the daemon's queue) asks before a run starts."""
    task.module  # noqa: B018  (TaskError: reference.py does not import, or lacks get_inputs/reference)
    task_signature(task, "cpu")


def task_signature(task: Task, size: str = "cpu") -> TaskSignature:
    """Trace a task's reference at ``size`` on abstract inputs drawn by ``jax.eval_shape``."""
    import jax

    captured: dict[str, dict[str, Any]] = {}

    def draw(key: Any) -> Any:
        args, static = task.get_inputs(key, size)
        captured["static"] = static
        return args

    try:
        abstract_args = jax.eval_shape(draw, jax.random.key(0))
    except Exception as exc:
        raise SignatureError(f"{task.path}: cannot draw abstract inputs: {type(exc).__name__}: {exc}") from exc
    static = captured["static"]
    reference = task.reference

    def bound(*args: Any) -> Any:
        return reference(*args, **static)

    return trace_signature(bound, abstract_args, task_id=task.id, category=task.spec.category, size=size)
