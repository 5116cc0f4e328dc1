"""NVIDIA GPU specs from ``config/targets.yaml`` (its ``gpu:`` section): what the GPU cost model and the
shared-memory check use."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from maxkernel.targets.names import GPU_CHIPS, TargetError, gpu_chip
from maxkernel.targets.specs import GPU_KEY, TARGETS_FILE, Constant

Backend = Literal["triton", "mosaic"]


class GpuSpec(BaseModel):
    """One GPU chip. Rates are per chip; ``per_sm`` gives one streaming multiprocessor's share."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    device_kind: str = Field(description="jax device_kind of this chip")
    compute_capability: str
    backend: Backend = Field(description="the Pallas backend kernels for this chip lower through by default")
    sms: int = Field(gt=0)
    peak_bf16_flops: float = Field(gt=0, description="dense FP16/BF16 tensor-core FLOP/s")
    peak_tf32_flops: float = Field(gt=0, description="dense TF32 tensor-core FLOP/s (f32 dots)")
    peak_int8_ops: float = Field(gt=0)
    peak_f32_flops: float = Field(gt=0, description="FP32 FLOP/s on the CUDA cores (FMA = 2)")
    cuda_core_ops: float = Field(gt=0, description="elementwise f32 ops/s")
    sfu_ops: float = Field(gt=0, description="transcendental ops/s")
    hbm_bandwidth: float = Field(gt=0, description="bytes/s")
    hbm_bytes: int = Field(gt=0)
    smem_per_sm: int = Field(gt=0)
    smem_per_block: int = Field(gt=0, description="most shared memory one program instance may use")
    max_warps_per_sm: int = Field(gt=0)
    max_blocks_per_sm: int = Field(gt=0)

    @model_validator(mode="after")
    def _consistent(self) -> "GpuSpec":
        if self.smem_per_block > self.smem_per_sm:
            raise ValueError("smem_per_block exceeds smem_per_sm")
        return self

    @property
    def target(self) -> str:
        return f"gpu-{self.name}"

    def per_sm(self, chip_rate: float) -> float:
        """One SM's share of a per-chip rate."""
        return chip_rate / self.sms


class GpuModelConstants(BaseModel):
    """Constants of the GPU cost model that are the same for every chip (``gpu.model`` in the targets file)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    launch_overhead_s: Constant
    dispatch_overhead_s: Constant
    hbm_efficiency: Constant
    l2_bandwidth_ratio: Constant
    saturating_warps: Constant
    dot_efficiency: Constant
    xla_dot_efficiency: Constant


def _gpu_section(path: Path) -> dict:
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise TargetError(f"{path}: cannot read GPU specs: {exc}") from exc
    section = (raw or {}).get(GPU_KEY)
    if not isinstance(section, dict):
        raise TargetError(f"{path}: no '{GPU_KEY}:' section with chips and model")
    return section


def _first_error(path: Path, where: str, exc: ValidationError) -> TargetError:
    first = exc.errors()[0]
    loc = ".".join(str(p) for p in first["loc"])
    return TargetError(f"{path}: {GPU_KEY}.{where}.{loc}: {first['msg']}")


@lru_cache(maxsize=4)
def load_gpu_specs(path: Path = TARGETS_FILE) -> dict[str, GpuSpec]:
    """All chips in the targets file, validated; the file must cover exactly :data:`GPU_CHIPS`."""
    chips = _gpu_section(Path(path)).get("chips") or {}
    if sorted(chips) != sorted(GPU_CHIPS):
        raise TargetError(f"{path}: GPU chips {sorted(chips)} differ from {sorted(GPU_CHIPS)}")
    specs = {}
    for name, values in chips.items():
        try:
            specs[name] = GpuSpec.model_validate({"name": name, **(values or {})})
        except ValidationError as exc:
            raise _first_error(Path(path), f"chips.{name}", exc) from exc
    return specs


def load_gpu_spec(chip: str, path: Path = TARGETS_FILE) -> GpuSpec:
    """The spec of one chip, named ``"h100"`` or ``"gpu-h100"``."""
    return load_gpu_specs(Path(path))[gpu_chip(chip)]


@lru_cache(maxsize=4)
def load_gpu_constants(path: Path = TARGETS_FILE) -> GpuModelConstants:
    """The ``gpu.model`` section of the targets file, validated."""
    try:
        return GpuModelConstants.model_validate(_gpu_section(Path(path)).get("model"))
    except ValidationError as exc:
        raise _first_error(Path(path), "model", exc) from exc
