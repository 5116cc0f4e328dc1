"""Counting the work of a traced program: MXU flops by input precision, VPU and EUP ops, manual DMA bytes.

One set of rules serves Pallas kernel bodies (per grid step) and plain-JAX programs, so a candidate and the
reference are counted alike:

- ``dot_general``, ``ragged_dot_general``: 2 * output elements * contracted size, on the MXU. A ragged dot is
  counted at its true size (each row meets one group), not as a dense matmul per group.
- ``conv_general_dilated``: 2 * output elements * (input features per group * kernel window), on the MXU,
  divided by the input dilation of a transposed conv (its inserted zeros are not multiplied).
- transcendentals (exp, log, tanh, rsqrt, ...): one EUP op per output element.
- reductions and scans along an axis: one VPU op per input element.
- other elementwise work, casts included: one VPU op per output element; ops on scalars run on the scalar
  unit and are not counted.
- data movement inside VMEM (broadcast, reshape, transpose, slicing, ref loads and stores): free.
- common subexpressions: a pure equation that repeats an earlier one of the same body on the same values
  is counted once, as a compiler computes it once (:class:`CommonWork`).
- control flow: each body and branch is charged for the times it runs, from the records of
  ``maxkernel.targets.control`` (branch counts, loop trips). A ``cond`` without a record is charged as its
  heavier branch; a ``scan`` without one runs its length; a ``while`` without one is refused
  (:class:`UnboundedLoopError`): what the model cannot bound is never counted as free.
- ``dma_start`` between HBM and VMEM/SMEM: the bytes of the copied window.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from jax import tree_util
from jax._src import core

from jaxbench.tpu_numerics import mxu_class as _mxu_class  # one rule for the price and the checked numerics
from maxkernel.targets.control import Path, site_name
from maxkernel.targets.jaxpr_walk import sub_jaxprs
from maxkernel.targets.names import TargetError
from maxkernel.targets.specs import TpuSpec, load_model_constants

TRANSCENDENTAL = frozenset({
    "exp", "exp2", "log", "log1p", "expm1", "tanh", "logistic", "sin", "cos", "tan", "asin", "acos", "atan",
    "atan2", "sinh", "cosh", "asinh", "acosh", "atanh", "sqrt", "rsqrt", "cbrt", "pow", "erf", "erfc",
    "erf_inv", "lgamma", "digamma", "igamma", "bessel_i0e", "bessel_i1e",
})
REDUCTIONS = frozenset({
    "reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or", "reduce_xor",
    "argmax", "argmin", "cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp", "reduce",
})
FREE = frozenset({
    "broadcast_in_dim", "reshape", "squeeze", "expand_dims", "slice", "dynamic_slice", "iota",
    "bitcast_convert_type", "get", "swap", "masked_swap", "program_id", "num_programs", "device_put", "split",
    "dma_wait", "semaphore_signal", "semaphore_wait", "semaphore_read", "multiple_of", "debug_callback",
    "sharding_constraint", "optimization_barrier", "stop_gradient", "random_bits", "random_seed",
    "random_wrap", "random_unwrap", "prng_seed", "prng_random_bits", "delay",
})
MXU_CLASSES = ("bf16", "f32_high", "f32", "int8")


@dataclass
class OpCounts:
    """Work of one program run (or one grid step of a kernel body)."""

    mxu: dict[str, float] = field(default_factory=dict)  # MXU_CLASSES -> flops
    # MXU flops as XLA runs them: each matmul padded to MXU tiles and divided by XLA's efficiency at its size
    mxu_xla: dict[str, float] = field(default_factory=dict)
    vpu: float = 0.0
    transcendental: float = 0.0
    dma_bytes: float = 0.0
    dma_count: float = 0.0  # manual DMAs started (each pays the model's per-DMA issue cost)
    # bf16-class MXU flops whose operands are float32 (default precision): one MXU pass, but the operands are
    # fed at a slower rate than bf16 ones (``model.f32_mxu_slowdown`` in the targets file)
    f32_operand_flops: float = 0.0
    ref_load_bytes: float = 0.0  # bytes read from refs (a GPU kernel's loads from global memory; free on TPU)

    @property
    def mxu_flops(self) -> float:
        return float(sum(self.mxu.values()))

    @property
    def flops(self) -> float:
        return self.mxu_flops + self.vpu + self.transcendental

    def add(self, other: "OpCounts", times: float = 1.0) -> None:
        for cls, flops in other.mxu.items():
            self.mxu[cls] = self.mxu.get(cls, 0.0) + flops * times
        for cls, flops in other.mxu_xla.items():
            self.mxu_xla[cls] = self.mxu_xla.get(cls, 0.0) + flops * times
        self.vpu += other.vpu * times
        self.transcendental += other.transcendental * times
        self.dma_bytes += other.dma_bytes * times
        self.dma_count += other.dma_count * times
        self.f32_operand_flops += other.f32_operand_flops * times
        self.ref_load_bytes += other.ref_load_bytes * times

    def compute_seconds(self, spec: TpuSpec, cores: int, xla: bool = False) -> float:
        """Time on ``cores`` TensorCores: MXU, VPU and EUP work one after the other. Kernel code runs the MXU
        at peak (its blocks are what it multiplies); ``xla`` code at the efficiency XLA reaches (``mxu_xla``)."""
        rates = {"bf16": spec.peak_bf16_flops, "f32_high": 2 * spec.peak_f32_flops,
                 "f32": spec.peak_f32_flops, "int8": spec.peak_int8_ops}
        share = cores / spec.cores_per_chip
        mxu = self.mxu_xla if xla else self.mxu
        seconds = sum(flops / (rates[cls] * share) for cls, flops in mxu.items())
        seconds += self.vpu / (spec.vpu_ops * share) + self.transcendental / (spec.eup_ops * share)
        if not xla and self.f32_operand_flops:
            slowdown = load_model_constants().f32_mxu_slowdown.value
            seconds += self.f32_operand_flops * (slowdown - 1.0) / (spec.peak_bf16_flops * share)
        return seconds


class UnboundedLoopError(TargetError):
    """A ``while`` loop whose trip count the model cannot bound from the task's inputs: refused, not free."""


Charge = tuple["OpCounts", Any]  # work of one run, and how many times it runs (a number or one per grid step)


def charges(jaxpr: core.Jaxpr, records: Mapping[Path, Any], times: Any = 1.0, path: Path = ()) -> list[Charge]:
    """The work of ``jaxpr`` split by how often each part runs. ``records`` are absolute execution counts
    from :class:`maxkernel.targets.control.Interpreter` (``times`` is how often this code runs where no record
    says otherwise); nested pallas_call equations are skipped (they are modelled apart)."""
    out: list[Charge] = []
    level = OpCounts()
    common = CommonWork()
    for position, eqn in enumerate(jaxpr.eqns):
        here = (*path, position)
        name = eqn.primitive.name
        subs = [sub for _, sub in sub_jaxprs(eqn)]
        if name == "pallas_call":
            continue
        if name not in ("cond", "while", "scan") and common.seen(eqn):
            continue
        if not subs:
            count_eqn(eqn, level)
        elif name == "cond":
            record = records.get(here)
            branches = [b.jaxpr for b in eqn.params["branches"]]
            if record is not None:
                for j, branch in enumerate(branches):
                    out.extend(charges(branch, records, np.asarray(record)[..., j], (*here, j)))
            else:
                options = [charges(branch, records, times, (*here, j)) for j, branch in enumerate(branches)]
                out.extend(max(options, key=_heft))
        elif name in ("while", "scan"):
            record = records.get(here)
            body = eqn.params["body_jaxpr" if name == "while" else "jaxpr"].jaxpr
            if record is None and name == "while":
                raise UnboundedLoopError(f"a while loop at {site_name(eqn)} has a trip count the model cannot "
                                         "bound from the task's inputs; it is refused rather than priced once")
            trips = np.asarray(times) * float(eqn.params["length"]) if record is None else np.asarray(record)
            out.extend(charges(body, records, trips, (*here, 0)))
        else:  # calls and scoped regions run once where they stand
            for k, sub in enumerate(subs):
                out.extend(charges(sub, records, times, (*here, k)))
    out.append((level, times))
    return out


class CommonWork:
    """Common subexpressions of one body: an equation (or a call) that repeats a pure one on the same values (a
    mask built again for each head of an unrolled loop) is the value the compiler already has, and costs
    nothing again. Equations with effects (ref reads and writes, DMAs) are never taken for one another, nor
    are branches and loops."""

    def __init__(self) -> None:
        self._alias: dict[core.Var, core.Var] = {}
        self._outputs: dict[tuple[Any, ...], list[core.Var]] = {}

    def seen(self, eqn: core.JaxprEqn) -> bool:
        """Whether ``eqn`` repeats an earlier one (its outputs are then read as that one's)."""
        if eqn.effects or not eqn.outvars:
            return False
        try:
            key = (eqn.primitive.name, tuple(sorted((k, repr(v)) for k, v in eqn.params.items())),
                   tuple(self._operand(v) for v in eqn.invars))
            hash(key)
        except TypeError:  # an operand or parameter that cannot be compared: counted as written
            return False
        earlier = self._outputs.get(key)
        if earlier is None:
            self._outputs[key] = list(eqn.outvars)
            return False
        for out, before in zip(eqn.outvars, earlier):
            self._alias[out] = before
        return True

    def _operand(self, v: Any) -> Any:
        if isinstance(v, core.Literal):
            return ("literal", repr(v.val), str(v.aval))
        return self._alias.get(v, v)


def _heft(option: list[Charge]) -> float:
    return sum(float(np.sum(t)) * (c.flops + c.dma_bytes) for c, t in option)


def count_ops(jaxpr: core.Jaxpr, records: Mapping[Path, Any] | None = None) -> OpCounts:
    """Total work of one run of ``jaxpr`` (see :func:`charges`)."""
    counts = OpCounts()
    for part, times in charges(jaxpr, records or {}):
        counts.add(part, float(np.sum(times)))
    return counts


def _size(aval: core.AbstractValue) -> int:
    shape = getattr(aval, "shape", ())
    return int(np.prod(shape)) if shape else 0


def count_eqn(eqn: core.JaxprEqn, counts: OpCounts) -> None:
    """Add one equation's work to ``counts``."""
    name = eqn.primitive.name
    if name == "pallas_call":
        return
    if name in ("dot_general", "ragged_dot_general"):
        dims = eqn.params["dimension_numbers"] if name == "dot_general" else \
            eqn.params["ragged_dot_dimension_numbers"].dot_dimension_numbers
        lhs, rhs = eqn.invars[0].aval, eqn.invars[1].aval
        contracted = math.prod(lhs.shape[d] for d in dims[0][0])
        flops = 2.0 * _size(eqn.outvars[0].aval) * contracted
        cls = _mxu_class(lhs.dtype, rhs.dtype, eqn.params.get("precision"))
        counts.mxu[cls] = counts.mxu.get(cls, 0.0) + flops
        if cls == "bf16" and any(np.dtype(a.dtype) == np.float32 for a in (lhs, rhs)):
            counts.f32_operand_flops += flops
        free_lhs = [d for d in range(len(lhs.shape)) if d not in (*dims[0][0], *dims[1][0])]
        free_rhs = [d for d in range(len(rhs.shape)) if d not in (*dims[0][1], *dims[1][1])]
        batch = math.prod(lhs.shape[d] for d in dims[1][0])
        rows = math.prod(lhs.shape[d] for d in free_lhs)
        cols = math.prod(rhs.shape[d] for d in free_rhs)
        counts.mxu_xla[cls] = counts.mxu_xla.get(cls, 0.0) + batch * xla_matmul_flops(rows, cols, contracted)
    elif name == "conv_general_dilated":
        lhs, rhs = eqn.invars[0].aval, eqn.invars[1].aval
        out_features = rhs.shape[eqn.params["dimension_numbers"].rhs_spec[0]]
        # A transposed conv (lhs dilation) multiplies the inserted zeros in no real implementation.
        dilation = math.prod(eqn.params.get("lhs_dilation") or (1,))
        flops = 2.0 * _size(eqn.outvars[0].aval) * math.prod(rhs.shape) / out_features / dilation
        cls = _mxu_class(lhs.dtype, rhs.dtype, eqn.params.get("precision"))
        counts.mxu[cls] = counts.mxu.get(cls, 0.0) + flops
        # As an implicit GEMM: (output pixels) x (output features) x (window * input features per group).
        pixels = _size(eqn.outvars[0].aval) / out_features
        window = flops / (2.0 * max(pixels * out_features, 1.0))
        counts.mxu_xla[cls] = counts.mxu_xla.get(cls, 0.0) + xla_matmul_flops(pixels, out_features, window)
    elif name == "dma_start":
        hbm_bytes, on_chip = _dma_bytes(eqn)
        counts.dma_bytes += hbm_bytes
        counts.dma_count += 1
        counts.vpu += on_chip  # a copy between on-chip buffers moves its elements through the vector units
    elif name == "dynamic_update_slice":  # a value written into a window of another: the window's elements
        counts.vpu += _size(eqn.invars[1].aval)
    elif name in ("get", "masked_load") and eqn.outvars:  # ref indexing and pl.load
        aval = eqn.outvars[0].aval
        counts.ref_load_bytes += int(np.prod(aval.shape)) * np.dtype(aval.dtype).itemsize  # a scalar: one element
    elif name == "addupdate":
        counts.vpu += _size(eqn.invars[1].aval)
    elif name in FREE:
        return
    elif name in REDUCTIONS:
        counts.vpu += sum(_size(v.aval) for v in eqn.invars)
    elif name == "sort":
        operand = eqn.invars[0].aval
        if operand.shape:
            length = operand.shape[eqn.params.get("dimension", -1)]
            counts.vpu += _size(operand) * max(1, math.ceil(math.log2(max(length, 2))))
    elif name in TRANSCENDENTAL:
        counts.transcendental += sum(_size(v.aval) for v in eqn.outvars)
    else:
        counts.vpu += sum(_size(v.aval) for v in eqn.outvars)


def xla_matmul_flops(rows: float, cols: float, depth: float) -> float:
    """MXU flops XLA spends on one (rows x depth) @ (depth x cols) matmul, in peak-rate flops: the dims padded
    to MXU tiles (rows to 8 sublanes, cols and depth to 128 lanes) and divided by XLA's efficiency at that
    size (``model.xla_matmul`` in the targets file)."""
    padded = [_round_up(rows, 8), _round_up(cols, 128), _round_up(depth, 128)]
    size = math.prod(padded) ** (1.0 / 3.0)
    return 2.0 * math.prod(padded) / load_model_constants().xla_matmul.at(size)


def _round_up(value: float, tile: int) -> float:
    return float(-(-math.ceil(value) // tile) * tile) if value > 0 else 0.0


def _window_aval(ref: object) -> core.AbstractValue:
    """The abstract value a DMA endpoint denotes: a Var's aval, or a transformed ref's (``buf.at[i]``,
    ``hbm.at[pl.ds(...)]``) with its transforms applied to the underlying ref's aval. In a jaxpr the base of a
    TransformedRef is a Var, which JAX's own ``TransformedRef.shape`` cannot type, so it is done here."""
    if not hasattr(ref, "transforms"):
        return ref.aval  # type: ignore[attr-defined]
    aval = _window_aval(ref.ref)  # type: ignore[attr-defined]
    for transform in ref.transforms:  # type: ignore[attr-defined]
        aval = transform.transform_type(aval)
    return aval


def _memory_space(ref: object) -> str:
    space = getattr(_window_aval(ref), "memory_space", None)
    return str(getattr(space, "value", space)).lower()


def _dma_bytes(eqn: core.JaxprEqn) -> tuple[float, float]:
    """(HBM bytes, on-chip elements) of a local DMA. Between HBM and on-chip memory it moves its window once
    through HBM; from HBM to HBM it reads and writes it (twice); between on-chip buffers it moves no HBM
    bytes but its elements still pass through the core."""
    parts = tree_util.tree_unflatten(eqn.params["tree"], eqn.invars)
    src, dst = parts[0], parts[1]
    in_hbm = [_memory_space(ref) in ("any", "hbm") for ref in (src, dst)]
    window = _window_aval(dst if not in_hbm[1] else src)
    elements = float(math.prod(window.shape))
    nbytes = elements * np.dtype(window.dtype).itemsize
    if all(in_hbm):
        return 2.0 * nbytes, 0.0
    if any(in_hbm):
        return nbytes, 0.0
    return 0.0, elements
