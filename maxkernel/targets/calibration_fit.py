"""The model's Pallas rates and overheads fitted to measured programs, and the fit judged on held-out traces.

Pricing a program is slow (tracing, control-flow records) but the price is cheap arithmetic on what that
finds: per kernel the work of each part with how often it runs at each grid step, the blocks' traffic, the
cores and how often the kernel runs; and the XLA code's time. :func:`capture_pieces` keeps those pieces
from one real pricing (inside the sandbox), and :func:`predict` re-prices them under other constants through
the model's own :func:`maxkernel.targets.model.pipeline_seconds`, so a fit explores thousands of constant
sets in seconds and prices exactly as the model does.

The six fitted constants (:class:`FitParams`): the VPU rate and the EUP rate (as fractions of the bf16 MXU
peak, one rule for every generation), the slowdown of a default-precision f32-operand matmul on the MXU,
the per-grid-step and per-DMA overheads, and the scale from XLA:TPU's ``optimal_seconds`` to device time.
The objective is the squared log error of modelled over measured time on the training nodes; the Pallas
matmul guide's table (``maxkernel.targets.calibration``) is a constraint every fit must meet.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
from pydantic import BaseModel

from maxkernel.targets import model as model_module
from maxkernel.targets import ops as ops_module
from maxkernel.targets.blocks import StepTraffic
from maxkernel.targets.grid import GridSample
from maxkernel.targets.ops import OpCounts
from maxkernel.targets.specs import Constant, ModelConstants, TpuSpec, load_model_constants, load_tpu_spec
from maxkernel.targets.work import StepWork

COUNT_FIELDS = ("vpu", "transcendental", "dma_bytes", "dma_count", "f32_operand_flops")


class KernelPieces(BaseModel):
    parts: list[tuple[dict[str, Any], list[float]]]  # OpCounts fields, runs at step 0 then at each sampled step
    grid: list[int]
    steps: int
    t: list[int]
    weight: float
    sampled: bool
    first_bytes: float
    last_bytes: float
    step_bytes: list[float]
    cores: int
    count: float


class Pieces(BaseModel):
    generation: str
    kernels: list[KernelPieces]
    xla_s: float  # the XLA code's time (whole program or glue), dispatch excluded, as priced
    xla_by_tpu: bool  # priced by XLA:TPU (scales with xla_tpu_scale) or by the fallback (does not)
    xla_scale: float  # the xla_tpu_scale it was priced with


class FitParams(BaseModel):
    vpu_fraction: float  # VPU elementwise ops/s over the bf16 MXU peak
    eup_fraction: float  # EUP transcendentals/s over the bf16 MXU peak
    f32_mxu_slowdown: float
    step_overhead_s: float
    dma_overhead_s: float
    xla_tpu_scale: float

    def vector(self) -> np.ndarray:
        return np.log(np.array([getattr(self, f) for f in FIT_FIELDS]))

    @classmethod
    def of(cls, vector: np.ndarray) -> "FitParams":
        return cls(**dict(zip(FIT_FIELDS, (float(v) for v in np.exp(vector)))))


FIT_FIELDS = tuple(FitParams.model_fields)
# Bounds (each a physical range, not a fitted result): rates between 1/100 and 1/2 of the MXU peak, an f32
# slowdown between 1 (bf16 speed) and 6 (six passes), overheads between 10 ns and 10 us, the XLA scale 0.5-2.
# Bounds (each a physical range, not a fitted result): the VPU between one op per lane per cycle (1024 lanes at
# about 1.5 GHz: 0.002 of v6e's bf16 peak) and half the MXU peak, the EUP down to a quarter of that floor, an
# f32 slowdown between 1 (bf16 speed) and 6 (six passes), overheads between 10 ns and 10 us, the XLA scale
# 0.5-2.
BOUNDS = {"vpu_fraction": (0.002, 0.5), "eup_fraction": (0.0005, 0.25), "f32_mxu_slowdown": (1.0, 6.0),
          "step_overhead_s": (1e-8, 1e-5), "dma_overhead_s": (1e-8, 1e-5), "xla_tpu_scale": (0.5, 2.0)}
# A constant the training programs barely constrain (the per-DMA cost where none of them starts a DMA) must not
# drift to a bound: each is pulled gently (this weight on its squared log distance) towards where it started,
# the model as it was before fitting (no DMA cost: the lower bound).
PRIOR_WEIGHT = 1e-3


def current_params(generation: str = "v6e") -> FitParams:
    """The constants the model uses now, as fit parameters."""
    spec, constants = load_tpu_spec(generation), load_model_constants()
    return FitParams(vpu_fraction=spec.vpu_ops / spec.peak_bf16_flops, eup_fraction=spec.eup_ops / spec.peak_bf16_flops,
                     f32_mxu_slowdown=constants.f32_mxu_slowdown.value, step_overhead_s=spec.step_overhead_s,
                     dma_overhead_s=max(constants.dma_overhead_s.value, BOUNDS["dma_overhead_s"][0]),
                     xla_tpu_scale=constants.xla_tpu_scale.value)


def capture_pieces(run: Callable[[], Any]) -> tuple[Any, Pieces]:
    """Run one pricing (``run()`` returns a ModelEstimate) and keep the pieces its price is made of."""
    recorded: list[tuple[StepWork, StepTraffic, GridSample, int]] = []
    original = model_module.pipeline_seconds

    def spy(work: StepWork, traffic: StepTraffic, sample: GridSample, spec: TpuSpec, cores: int) -> float:
        recorded.append((work, traffic, sample, cores))
        return original(work, traffic, sample, spec, cores)

    model_module.pipeline_seconds = spy  # type: ignore[assignment]
    try:
        estimate = run()
    finally:
        model_module.pipeline_seconds = original  # type: ignore[assignment]
    kernels = []
    for (work, traffic, sample, cores), kernel in zip(recorded, estimate.kernels):
        parts = []
        for counts, times in work.parts:
            fields = {f: float(getattr(counts, f)) for f in COUNT_FIELDS}
            fields["mxu"] = {k: float(v) for k, v in counts.mxu.items()}
            runs = np.broadcast_to(np.asarray(times, dtype=np.float64), (1 + len(sample.t),))
            parts.append((fields, [float(x) for x in runs]))
        kernels.append(KernelPieces(
            parts=parts, grid=list(sample.grid), steps=sample.steps, t=[int(x) for x in sample.t],
            weight=sample.weight, sampled=sample.sampled, first_bytes=traffic.first_bytes,
            last_bytes=traffic.last_bytes, step_bytes=[float(x) for x in traffic.step_bytes], cores=cores,
            count=kernel.count))
    constants = load_model_constants()
    kernel_s = sum(k.time_ms for k in estimate.kernels) / 1e3
    xla_s = max(estimate.time_ms / 1e3 - kernel_s - constants.dispatch_overhead_s.value, 0.0)
    by_tpu = any("XLA:TPU's compiled program" in note for note in estimate.notes)
    return estimate, Pieces(generation=estimate.generation, kernels=kernels, xla_s=xla_s, xla_by_tpu=by_tpu,
                            xla_scale=constants.xla_tpu_scale.value)


@contextmanager
def fitted_constants(params: FitParams) -> Iterator[None]:
    """The model's constants replaced by ``params`` for the duration (model-wide: used by fits only)."""
    base = load_model_constants()
    update = {"dma_overhead_s": Constant(value=params.dma_overhead_s, assumed="fit"),
              "f32_mxu_slowdown": Constant(value=params.f32_mxu_slowdown, assumed="fit"),
              "xla_tpu_scale": Constant(value=params.xla_tpu_scale, assumed="fit")}
    patched: ModelConstants = base.model_copy(update=update)
    saved = model_module._constants, ops_module.load_model_constants
    model_module._constants = lambda: patched  # type: ignore[assignment]
    ops_module.load_model_constants = lambda *a, **k: patched  # type: ignore[assignment]
    try:
        yield
    finally:
        model_module._constants, ops_module.load_model_constants = saved  # type: ignore[assignment]


def fitted_spec(generation: str, params: FitParams) -> TpuSpec:
    spec = load_tpu_spec(generation)
    return spec.model_copy(update={"vpu_ops": spec.peak_bf16_flops * params.vpu_fraction,
                                   "eup_ops": spec.peak_bf16_flops * params.eup_fraction,
                                   "step_overhead_s": params.step_overhead_s})


def _rebuild(k: KernelPieces) -> tuple[StepWork, StepTraffic, GridSample]:
    sample = GridSample(grid=tuple(k.grid), steps=k.steps, t=np.asarray(k.t, dtype=np.int64), weight=k.weight,
                        sampled=k.sampled)
    parts = []
    for fields, runs in k.parts:
        counts = OpCounts(mxu=dict(fields["mxu"]), **{f: fields[f] for f in COUNT_FIELDS})
        parts.append((counts, np.asarray(runs)))
    traffic = StepTraffic(k.first_bytes, k.last_bytes, np.asarray(k.step_bytes), k.weight)
    return StepWork(parts, sample), traffic, sample


class Prepared:
    """Pieces rebuilt once into the model's own objects, to be re-priced many times."""

    def __init__(self, pieces: Pieces) -> None:
        self.pieces = pieces
        self.kernels = [(_rebuild(k), k.cores, k.count) for k in pieces.kernels]

    def seconds(self, params: FitParams) -> float:
        """Modelled device time (dispatch excluded) under ``params``."""
        spec = fitted_spec(self.pieces.generation, params)
        total = 0.0
        with fitted_constants(params):
            for (work, traffic, sample), cores, count in self.kernels:
                total += model_module.pipeline_seconds(work, traffic, sample, spec, cores) * count
        xla = self.pieces.xla_s
        if self.pieces.xla_by_tpu and self.pieces.xla_scale > 0:
            xla *= params.xla_tpu_scale / self.pieces.xla_scale
        return total + xla


class GuideRow(BaseModel):
    """One row of the matmul guide's table as pieces: its ideal seconds and published fraction of peak."""

    pieces: Pieces
    ideal_s: float
    published: float


def guide_pieces() -> list[GuideRow]:
    """The matmul guide's rows priced once, kept as pieces (our own programs: priced in this process)."""
    import tempfile
    from pathlib import Path

    from jaxbench.task import load_task
    from maxkernel.targets.calibration import PUBLISHED, REFERENCE, TASK_YAML, tiled_matmul_source
    from maxkernel.targets.model import model_candidate, model_reference

    rows = []
    spec = load_tpu_spec("v5e")
    with tempfile.TemporaryDirectory() as tmp:
        for program, blocks, size, published in PUBLISHED:
            folder = Path(tmp) / f"calib_{size}"
            if not folder.exists():
                folder.mkdir()
                (folder / "task.yaml").write_text(TASK_YAML.format(n=size))
                (folder / "reference.py").write_text(REFERENCE)
            task = load_task(folder)
            if blocks is None:
                _, pieces = capture_pieces(lambda: model_reference(task, "v5e"))
            else:
                _, pieces = capture_pieces(lambda: model_candidate(tiled_matmul_source(*blocks), task, "v5e"))
            rows.append(GuideRow(pieces=pieces, ideal_s=2.0 * size**3 / spec.peak_bf16_flops, published=published))
    return rows


def guide_within(rows: list[tuple[Prepared, GuideRow]], params: FitParams) -> tuple[int, float]:
    """(rows within the guide's stated error, total excess beyond it in fractions of peak) under ``params``."""
    from maxkernel.targets.calibration import POINTS_TOLERANCE, RELATIVE_TOLERANCE

    dispatch = load_model_constants().dispatch_overhead_s.value
    within, excess = 0, 0.0
    for prepared, row in rows:
        fraction = row.ideal_s / (prepared.seconds(params) + dispatch)
        allowed = RELATIVE_TOLERANCE * row.published if row.published > 0.10 else POINTS_TOLERANCE
        off = abs(fraction - row.published) - allowed
        within += off <= 0
        excess += max(off, 0.0)
    return within, excess


def fit(nodes: list[tuple[Prepared, float]], guide: list[tuple[Prepared, GuideRow]], start: FitParams,
        iterations: int = 1500) -> FitParams:
    """Constants minimising the squared log error on ``nodes`` (prepared pieces, measured seconds) within the
    bounds, with the guide's table as a constraint (a large penalty on any excess)."""
    from scipy.optimize import minimize

    VPU, EUP = FIT_FIELDS.index("vpu_fraction"), FIT_FIELDS.index("eup_fraction")
    lows = np.log([BOUNDS[f][0] for f in FIT_FIELDS])
    highs = np.log([BOUNDS[f][1] for f in FIT_FIELDS])
    measured = np.log([m for _, m in nodes])

    def loss(vector: np.ndarray) -> float:
        clipped = np.clip(vector, lows, highs)
        params = FitParams.of(clipped)
        modelled = np.log([max(p.seconds(params), 1e-9) for p, _ in nodes])
        penalty = 100.0 * float(np.sum((vector - clipped) ** 2)) + PRIOR_WEIGHT * float(np.sum((clipped - prior) ** 2))
        # a transcendental on the EUP is never cheaper than an elementwise op on the VPU
        penalty += 100.0 * max(0.0, float(clipped[EUP] - clipped[VPU])) ** 2
        if guide:
            penalty += 1000.0 * guide_within(guide, params)[1]
        return float(np.mean((modelled - measured) ** 2)) + penalty

    best = prior = np.clip(start.vector(), lows, highs)
    for _ in range(2):  # a restart from the first optimum escapes Nelder-Mead's early collapse
        result = minimize(loss, best, method="Nelder-Mead",
                          options={"maxiter": iterations, "xatol": 1e-3, "fatol": 1e-6})
        best = np.clip(result.x, lows, highs)
    return FitParams.of(best)


def log_error(params: FitParams, nodes: list[tuple[Prepared, float]]) -> float:
    return math.sqrt(float(np.mean([(math.log(p.seconds(params)) - math.log(m)) ** 2 for p, m in nodes])))
