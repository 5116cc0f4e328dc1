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
- control flow: scan bodies times their length; ``cond`` takes the larger of its branches, field by field
  (``work`` resolves a kernel's top-level ``pl.when`` per grid step instead); a ``while`` body is counted
  once (trip count unknown).
- ``dma_start`` between HBM and VMEM/SMEM: the bytes of the copied window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from jax import tree_util
from jax._src import core

from maxkernel.targets.jaxpr_walk import sub_jaxprs
from maxkernel.targets.specs import TpuSpec

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
    "broadcast_in_dim", "reshape", "squeeze", "expand_dims", "transpose", "slice", "dynamic_slice",
    "dynamic_update_slice", "concatenate", "pad", "rev", "gather", "iota", "copy", "copy_p",
    "bitcast_convert_type", "get", "swap", "program_id", "num_programs", "device_put", "split",
    "dma_wait", "semaphore_signal", "semaphore_wait", "semaphore_read", "multiple_of", "debug_callback",
    "sharding_constraint", "optimization_barrier", "stop_gradient", "random_bits", "random_seed",
    "random_wrap", "random_unwrap", "prng_seed", "prng_random_bits", "delay",
})
MXU_CLASSES = ("bf16", "f32_high", "f32", "int8")


@dataclass
class OpCounts:
    """Work of one program run (or one grid step of a kernel body)."""

    mxu: dict[str, float] = field(default_factory=dict)  # MXU_CLASSES -> flops
    vpu: float = 0.0
    transcendental: float = 0.0
    dma_bytes: float = 0.0
    unbounded_loops: int = 0

    @property
    def mxu_flops(self) -> float:
        return float(sum(self.mxu.values()))

    @property
    def flops(self) -> float:
        return self.mxu_flops + self.vpu + self.transcendental

    def add(self, other: "OpCounts", times: float = 1.0) -> None:
        for cls, flops in other.mxu.items():
            self.mxu[cls] = self.mxu.get(cls, 0.0) + flops * times
        self.vpu += other.vpu * times
        self.transcendental += other.transcendental * times
        self.dma_bytes += other.dma_bytes * times
        self.unbounded_loops += other.unbounded_loops

    def maximum(self, other: "OpCounts") -> None:
        for cls, flops in other.mxu.items():
            self.mxu[cls] = max(self.mxu.get(cls, 0.0), flops)
        self.vpu = max(self.vpu, other.vpu)
        self.transcendental = max(self.transcendental, other.transcendental)
        self.dma_bytes = max(self.dma_bytes, other.dma_bytes)
        self.unbounded_loops = max(self.unbounded_loops, other.unbounded_loops)

    def compute_seconds(self, spec: TpuSpec, cores: int) -> float:
        """Time on ``cores`` TensorCores at peak: MXU, VPU and EUP work one after the other."""
        rates = {"bf16": spec.peak_bf16_flops, "f32_high": 2 * spec.peak_f32_flops,
                 "f32": spec.peak_f32_flops, "int8": spec.peak_int8_ops}
        share = cores / spec.cores_per_chip
        seconds = sum(flops / (rates[cls] * share) for cls, flops in self.mxu.items())
        seconds += self.vpu / (spec.vpu_ops * share) + self.transcendental / (spec.eup_ops * share)
        return seconds


def count_ops(jaxpr: core.Jaxpr) -> OpCounts:
    """Work of one run of ``jaxpr``; nested pallas_call equations are skipped (they are modelled apart)."""
    counts = OpCounts()
    for eqn in jaxpr.eqns:
        count_eqn(eqn, counts)
    return counts


def largest(options: list[OpCounts]) -> OpCounts:
    """Field-by-field maximum: the charge of a branch whose choice is unknown."""
    worst = OpCounts()
    for option in options:
        worst.maximum(option)
    return worst


def _size(aval: core.AbstractValue) -> int:
    shape = getattr(aval, "shape", ())
    return int(np.prod(shape)) if shape else 0


def count_eqn(eqn: core.JaxprEqn, counts: OpCounts) -> None:
    """Add one equation's work to ``counts``."""
    name = eqn.primitive.name
    if name == "pallas_call":
        return
    subs = list(sub_jaxprs(eqn))
    if subs:
        _count_control(eqn, name, subs, counts)
    elif name in ("dot_general", "ragged_dot_general"):
        dims = eqn.params["dimension_numbers"] if name == "dot_general" else \
            eqn.params["ragged_dot_dimension_numbers"].dot_dimension_numbers
        lhs, rhs = eqn.invars[0].aval, eqn.invars[1].aval
        contracted = math.prod(lhs.shape[d] for d in dims[0][0])
        flops = 2.0 * _size(eqn.outvars[0].aval) * contracted
        cls = _mxu_class(lhs.dtype, rhs.dtype, eqn.params.get("precision"))
        counts.mxu[cls] = counts.mxu.get(cls, 0.0) + flops
    elif name == "conv_general_dilated":
        lhs, rhs = eqn.invars[0].aval, eqn.invars[1].aval
        out_features = rhs.shape[eqn.params["dimension_numbers"].rhs_spec[0]]
        # A transposed conv (lhs dilation) multiplies the inserted zeros in no real implementation.
        dilation = math.prod(eqn.params.get("lhs_dilation") or (1,))
        flops = 2.0 * _size(eqn.outvars[0].aval) * math.prod(rhs.shape) / out_features / dilation
        cls = _mxu_class(lhs.dtype, rhs.dtype, eqn.params.get("precision"))
        counts.mxu[cls] = counts.mxu.get(cls, 0.0) + flops
    elif name == "dma_start":
        counts.dma_bytes += _dma_bytes(eqn)
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


def _count_control(eqn: core.JaxprEqn, name: str, subs: list[tuple[str, core.Jaxpr]], counts: OpCounts) -> None:
    if name == "scan":
        counts.add(count_ops(subs[0][1]), float(eqn.params["length"]))
    elif name == "cond":
        counts.add(largest([count_ops(branch) for _, branch in subs]))
    elif name == "while":
        body = next(sub for key, sub in subs if key == "body_jaxpr")
        counts.add(count_ops(body))
        counts.unbounded_loops += 1
    else:  # calls (CALL_PRIMITIVES) and anything else holding programs: run once
        for _, sub in subs:
            counts.add(count_ops(sub))


def _mxu_class(lhs_dtype: np.dtype, rhs_dtype: np.dtype, precision: object) -> str:
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


def _memory_space(ref: object) -> str:
    aval = ref.ref.aval if hasattr(ref, "ref") else getattr(ref, "aval", None)  # TransformedRef or Var
    space = getattr(aval, "memory_space", None)
    return str(getattr(space, "value", space)).lower()


def _dma_bytes(eqn: core.JaxprEqn) -> float:
    """Bytes of a local DMA between HBM and on-chip memory (zero for on-chip copies)."""
    parts = tree_util.tree_unflatten(eqn.params["tree"], eqn.invars)
    src, dst = parts[0], parts[1]
    spaces = {_memory_space(src), _memory_space(dst)}
    if not spaces & {"any", "hbm"} or spaces <= {"any", "hbm"}:
        return 0.0
    window = dst if _memory_space(dst) not in ("any", "hbm") else src
    shape = window.shape if hasattr(window, "ref") else window.aval.shape
    dtype = (window.ref.aval if hasattr(window, "ref") else window.aval).dtype
    return float(math.prod(shape) * np.dtype(dtype).itemsize)
