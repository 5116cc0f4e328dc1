"""TPU generation specs from ``config/targets.yaml``: the numbers the cost model and VMEM check use."""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from maxkernel.config import CONFIG_DIR
from maxkernel.targets.names import GENERATIONS, TargetError, tpu_generation

TARGETS_FILE = CONFIG_DIR / "targets.yaml"


class TpuSpec(BaseModel):
    """One TPU generation. Rates are per chip; ``per_core`` gives one TensorCore's share."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    device_kind: str = Field(description="jax device_kind of this chip; selects the chip version in Mosaic")
    peak_bf16_flops: float = Field(gt=0)
    peak_f32_flops: float = Field(gt=0, description="f32 matmul at precision=HIGHEST")
    peak_int8_ops: float = Field(gt=0)
    vpu_ops: float = Field(gt=0, description="elementwise f32 ops/s on the vector unit")
    eup_ops: float = Field(gt=0, description="transcendental ops/s")
    hbm_bandwidth: float = Field(gt=0, description="bytes/s")
    hbm_bytes: int = Field(gt=0)
    vmem_bytes: int = Field(gt=0, description="VMEM per TensorCore")
    scoped_vmem_bytes: int = Field(gt=0, description="default VMEM limit of one Pallas kernel")
    mxu_shape: tuple[int, int]
    mxus_per_core: int = Field(gt=0)
    cores_per_chip: int = Field(gt=0)
    cores_per_device: int = Field(gt=0)
    step_overhead_s: float = Field(ge=0)

    @model_validator(mode="after")
    def _consistent(self) -> "TpuSpec":
        if self.cores_per_device > self.cores_per_chip:
            raise ValueError("cores_per_device exceeds cores_per_chip")
        if self.scoped_vmem_bytes > self.vmem_bytes:
            raise ValueError("scoped_vmem_bytes exceeds vmem_bytes")
        return self

    @property
    def target(self) -> str:
        return f"tpu-{self.name}"

    def per_core(self, chip_rate: float) -> float:
        """One TensorCore's share of a per-chip rate (peaks and HBM bandwidth are split evenly)."""
        return chip_rate / self.cores_per_chip

    def vmem_budget(self, vmem_limit_bytes: int | None) -> int:
        """VMEM one kernel may use: its own ``vmem_limit_bytes`` if set (capped at the physical VMEM)."""
        if vmem_limit_bytes is None:
            return self.scoped_vmem_bytes
        return min(int(vmem_limit_bytes), self.vmem_bytes)


@lru_cache(maxsize=4)
def load_tpu_specs(path: Path = TARGETS_FILE) -> dict[str, TpuSpec]:
    """All generations in the targets file, validated; the file must cover exactly :data:`GENERATIONS`."""
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise TargetError(f"{path}: cannot read TPU specs: {exc}") from exc
    if not isinstance(raw, dict):
        raise TargetError(f"{path}: expected a mapping of generation -> spec")
    raw = {k: v for k, v in raw.items() if k not in (MODEL_KEY, GPU_KEY)}
    if sorted(raw) != sorted(GENERATIONS):
        raise TargetError(f"{path}: generations {sorted(raw)} differ from {sorted(GENERATIONS)}")
    specs = {}
    for name, values in raw.items():
        try:
            specs[name] = TpuSpec.model_validate({"name": name, **(values or {})})
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise TargetError(f"{path}: {name}.{where}: {first['msg']}") from exc
    return specs


def load_tpu_spec(generation: str, path: Path = TARGETS_FILE) -> TpuSpec:
    """The spec of one generation, named ``"v5e"`` or ``"tpu-v5e"``."""
    return load_tpu_specs(Path(path))[tpu_generation(generation)]


MODEL_KEY = "model"
GPU_KEY = "gpu"  # NVIDIA chips: maxkernel.targets.gpu_spec


class Constant(BaseModel):
    """One model constant with where it comes from: a published ``source`` or an ``assumed`` reason."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    value: float = Field(ge=0)
    source: str | None = None
    assumed: str | None = None

    @model_validator(mode="after")
    def _says_why(self) -> "Constant":
        if (self.source is None) == (self.assumed is None):
            raise ValueError("give exactly one of source: or assumed:")
        return self


class EfficiencyCurve(BaseModel):
    """Fraction of MXU peak XLA reaches on a matmul, by size (the cube root of m * n * k), interpolated in
    log2(size) between the points and held flat beyond the ends."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sizes: tuple[float, ...]
    efficiency: tuple[float, ...]
    source: str

    @model_validator(mode="after")
    def _monotone_sizes(self) -> "EfficiencyCurve":
        if len(self.sizes) != len(self.efficiency) or not self.sizes:
            raise ValueError("sizes and efficiency must be non-empty and of one length")
        if list(self.sizes) != sorted(self.sizes) or not all(0 < e <= 1 for e in self.efficiency):
            raise ValueError("sizes must ascend and efficiencies lie in (0, 1]")
        return self

    def at(self, size: float) -> float:
        logs = [math.log2(s) for s in self.sizes]
        return float(np.interp(math.log2(max(size, 1.0)), logs, self.efficiency))


class ModelConstants(BaseModel):
    """Generation-independent constants of the cost model (``model:`` in the targets file)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dispatch_overhead_s: Constant
    hbm_efficiency: Constant
    xla_matmul: EfficiencyCurve
    dma_overhead_s: Constant = Field(description="issue cost of one manual DMA in a Pallas kernel")
    f32_mxu_slowdown: Constant = Field(description="a default-precision f32-operand matmul's time over bf16's")
    xla_tpu_scale: Constant = Field(description="measured device time over XLA:TPU's optimal_seconds")


@lru_cache(maxsize=4)
def load_model_constants(path: Path = TARGETS_FILE) -> ModelConstants:
    """The ``model:`` section of the targets file, validated."""
    try:
        raw = yaml.safe_load(Path(path).read_text())
        return ModelConstants.model_validate((raw or {}).get(MODEL_KEY))
    except (OSError, yaml.YAMLError) as exc:
        raise TargetError(f"{path}: cannot read model constants: {exc}") from exc
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise TargetError(f"{path}: {MODEL_KEY}.{where}: {first['msg']}") from exc
