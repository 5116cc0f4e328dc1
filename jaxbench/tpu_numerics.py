"""Matmuls computed as a TPU's MXU computes them, for checking TPU candidates on a machine without a TPU.

XLA:CPU (and Pallas interpret mode on a CPU) ignores a dot's precision config and multiplies float32 exactly.
A TPU does not: at the default precision its MXU rounds float32 operands to bfloat16 and accumulates in
float32 (one pass); ``HIGH`` splits each operand into two bfloat16 parts and adds three products (three
passes); ``HIGHEST`` is exact float32. The cost model prices MXU work by the same classes
(:func:`mxu_class`, imported by ``maxkernel.targets.ops``), so a candidate is checked with the numerics it is
priced for: a default-precision float32 matmul cannot be charged the bfloat16 rate and judged at float32
accuracy.

:func:`with_tpu_matmuls` rewrites a traced program: every MXU equation (``dot_general``,
``ragged_dot_general``, ``conv_general_dilated``) with a float32 operand is replaced by the computation its
class denotes, everywhere it sits: jit, scan, while and cond bodies, custom_jvp/vjp calls and Pallas kernel
bodies.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax import lax
from jax._src import core

# Equations that run on the MXU; each is bilinear in its first two operands.
MXU_PRIMITIVES = frozenset({"dot_general", "ragged_dot_general", "conv_general_dilated"})


def mxu_class(lhs_dtype: Any, rhs_dtype: Any, precision: object) -> str:
    """The MXU rate class of a matmul: ``int8``, ``bf16`` (one bf16 pass), ``f32_high`` (three passes) or
    ``f32`` (six passes, exact float32). Only operands of four bytes or more can ask for more than one pass."""
    dtypes = (np.dtype(lhs_dtype), np.dtype(rhs_dtype))
    if any(d.kind in "iu" for d in dtypes):
        return "int8"
    if any(d.itemsize >= 4 for d in dtypes):
        levels = precision if isinstance(precision, (tuple, list)) else (precision,)
        names = {str(getattr(p, "name", p)).upper() for p in levels if p is not None}
        if names & {"HIGHEST", "F32_F32_F32", "BF16_BF16_F32_X6"}:
            return "f32"
        if names & {"HIGH", "BF16_BF16_F32_X3", "TF32_TF32_F32"}:
            return "f32_high"
    return "bf16"


@dataclass
class Rewritten:
    """A program with its MXU equations computed as on a TPU, and how many equations changed per class."""

    closed: core.ClosedJaxpr
    changed: dict[str, int]

    @property
    def count(self) -> int:
        return sum(self.changed.values())


MXU_CLASSES = ("bf16", "f32_high", "f32")  # one, three and six bf16 passes per float32 product


def with_tpu_matmuls(closed: core.ClosedJaxpr, force: str | None = None) -> Rewritten:
    """``closed`` with every float32 MXU equation replaced by its TPU computation (see the module doc).
    ``force`` (one of :data:`MXU_CLASSES`) computes every float32 MXU equation in that class instead of the
    one its precision asks for: what the program would give at one, three or six passes."""
    if force is not None and force not in MXU_CLASSES:
        raise ValueError(f"unknown MXU class {force!r}; expected one of {', '.join(MXU_CLASSES)}")
    changed: dict[str, int] = {}
    jaxpr = _rewrite(closed.jaxpr, changed, force)
    return Rewritten(core.ClosedJaxpr(jaxpr, closed.consts), changed)


def computed_as_on_tpu(fn: Callable[..., Any], closed: core.ClosedJaxpr,
                       args: Sequence[Any], force: str | None = None) -> tuple[Callable[..., Any], int]:
    """``fn`` (traced as ``closed`` on the flat ``args``) with its matmuls computed as a TPU computes them
    (every one in class ``force`` when given), and how many equations changed; ``fn`` itself when none did.
    The outputs keep ``fn``'s structure."""
    rewritten = with_tpu_matmuls(closed, force)
    if not rewritten.count:
        return fn, 0
    tree = jax.tree_util.tree_structure(jax.eval_shape(fn, *args))
    flat = core.jaxpr_as_fun(rewritten.closed)
    return (lambda *a: jax.tree_util.tree_unflatten(tree, flat(*a))), rewritten.count


def _wide_float(aval: core.AbstractValue) -> bool:
    dtype = getattr(aval, "dtype", None)
    return dtype is not None and np.dtype(dtype).kind == "f" and np.dtype(dtype).itemsize >= 4


def _rewrite(jaxpr: core.Jaxpr, changed: dict[str, int], force: str | None = None) -> core.Jaxpr:
    eqns: list[core.JaxprEqn] = []
    for eqn in jaxpr.eqns:
        eqn = _rewrite_params(eqn, changed, force)
        cls = _class_of(eqn)
        if cls is not None and force is not None and cls != "int8":
            cls = force
        if cls in ("bf16", "f32_high"):
            eqns.extend(_replacement(eqn, cls))
            changed[cls] = changed.get(cls, 0) + 1
        else:
            eqns.append(eqn)
    return jaxpr.replace(eqns=eqns)


def _class_of(eqn: core.JaxprEqn) -> str | None:
    """The class of an MXU equation with a float32 operand; None for every other equation."""
    if eqn.primitive.name not in MXU_PRIMITIVES:
        return None
    lhs, rhs = eqn.invars[0].aval, eqn.invars[1].aval
    if not (_wide_float(lhs) or _wide_float(rhs)):
        return None
    return mxu_class(lhs.dtype, rhs.dtype, eqn.params.get("precision"))


def _rewrite_params(eqn: core.JaxprEqn, changed: dict[str, int], force: str | None = None) -> core.JaxprEqn:
    """The equation with every sub-program in its params rewritten (bodies, branches, kernels, calls)."""
    params: dict[str, Any] = {}
    for key, value in eqn.params.items():
        if isinstance(value, (tuple, list)) and any(isinstance(v, (core.Jaxpr, core.ClosedJaxpr)) for v in value):
            params[key] = type(value)(_rewrite_sub(v, changed, force) for v in value)
        elif isinstance(value, (core.Jaxpr, core.ClosedJaxpr)):
            params[key] = _rewrite_sub(value, changed, force)
    return eqn.replace(params={**eqn.params, **params}) if params else eqn


def _rewrite_sub(value: Any, changed: dict[str, int], force: str | None = None) -> Any:
    if isinstance(value, core.ClosedJaxpr):
        return core.ClosedJaxpr(_rewrite(value.jaxpr, changed, force), value.consts)
    if isinstance(value, core.Jaxpr):
        return _rewrite(value, changed, force)
    return value


def _to_bf16_precision(x: jax.Array) -> jax.Array:
    """``x`` rounded to bfloat16's 8 exponent and 7 mantissa bits (nearest-even), kept in its own dtype."""
    if not _wide_float(x):
        return x
    return lax.reduce_precision(x, exponent_bits=8, mantissa_bits=7)


def _replacement(eqn: core.JaxprEqn, cls: str) -> list[core.JaxprEqn]:
    """The equations that compute ``eqn`` as a TPU does for ``cls``, wired to ``eqn``'s own variables."""
    def mxu(a: jax.Array, b: jax.Array, rest: Sequence[jax.Array]) -> jax.Array:
        return eqn.primitive.bind(a, b, *rest, **eqn.params)

    def one_pass(a: jax.Array, b: jax.Array, *rest: jax.Array) -> jax.Array:
        return mxu(_to_bf16_precision(a), _to_bf16_precision(b), rest)

    def three_pass(a: jax.Array, b: jax.Array, *rest: jax.Array) -> jax.Array:
        # Each operand as a high and a low bfloat16 part; the low x low product is the one left out.
        a_hi, b_hi = _to_bf16_precision(a), _to_bf16_precision(b)
        a_lo = _to_bf16_precision(a - a_hi) if a_hi is not a else None
        b_lo = _to_bf16_precision(b - b_hi) if b_hi is not b else None
        small = [mxu(a_hi, b_lo, rest)] if b_lo is not None else []
        small += [mxu(a_lo, b_hi, rest)] if a_lo is not None else []
        total = small[0] if len(small) == 1 else small[0] + small[1]
        return total + mxu(a_hi, b_hi, rest)

    avals = [v.aval for v in eqn.invars]
    specs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in avals]
    traced = jax.make_jaxpr(one_pass if cls == "bf16" else three_pass)(*specs)
    return _inline(traced, eqn.invars, eqn)


def _inline(traced: core.ClosedJaxpr, invars: Sequence[core.Atom], eqn: core.JaxprEqn) -> list[core.JaxprEqn]:
    """``traced``'s equations with its inputs replaced by ``invars`` and its output by ``eqn``'s outputs."""
    inner = traced.jaxpr
    if traced.consts or inner.constvars:
        raise ValueError("a TPU matmul replacement captured constants")
    mapping: dict[core.Var, Any] = dict(zip(inner.invars, invars))
    outputs: dict[core.Var, core.Var] = {}
    for produced, final in zip(inner.outvars, eqn.outvars):
        if not isinstance(produced, core.Var) or produced in mapping:
            raise ValueError("a TPU matmul replacement does not compute its output")
        outputs[produced] = final

    def atom(v: core.Atom) -> core.Atom:
        return mapping.get(v, v) if isinstance(v, core.Var) else v

    result = []
    for sub in inner.eqns:
        result.append(sub.replace(invars=[atom(v) for v in sub.invars],
                                  outvars=[outputs.get(v, v) for v in sub.outvars],
                                  source_info=eqn.source_info, ctx=eqn.ctx))
    return result
