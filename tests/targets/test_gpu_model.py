"""The GPU cost model: occupancy, waves, shared windows, and ranking against the reference."""

from __future__ import annotations

import math

import pytest
from gpu_kernels import triton_matmul_source

from jaxbench.task import Task
from maxkernel.targets.gpu_blocks import ProgramShape, resident_blocks
from maxkernel.targets.gpu_model import model_gpu_candidate, model_gpu_reference
from maxkernel.targets.gpu_spec import load_gpu_spec, load_gpu_specs
from maxkernel.targets.names import TargetError, parse_target, resolve_gpu


def test_every_chip_loads_with_its_figures() -> None:
    specs = load_gpu_specs()
    assert sorted(specs) == ["a100", "b200", "h100", "h200"]
    assert specs["h200"].hbm_bandwidth > specs["h100"].hbm_bandwidth
    assert specs["a100"].backend == "triton" and specs["h100"].backend == "mosaic"


def test_gpu_names_parse_and_bare_gpu_is_refused_without_one() -> None:
    assert parse_target("gpu-h100") == ("gpu", "h100")
    with pytest.raises(TargetError, match="has none"):
        resolve_gpu("gpu")
    with pytest.raises(TargetError):
        parse_target("gpu-v100")


def test_occupancy_is_limited_by_warps_and_by_shared_memory() -> None:
    spec = load_gpu_spec("h100")
    small = ProgramShape("triton", 4, 2, 16 * 1024, 0, 0, 1)
    assert resident_blocks(small, spec) == min(64 // 4, spec.smem_per_sm // (16 * 1024))
    big = ProgramShape("triton", 4, 2, 120 * 1024, 0, 0, 1)
    assert resident_blocks(big, spec) == 1


def test_matmul_waves_window_bytes_and_speedup(matmul_task: Task) -> None:
    est = model_gpu_candidate(triton_matmul_source(64, 64, 32), matmul_task, "h100")
    (kernel,) = est.kernels
    m, k, n = 1024, 2048, 512
    assert kernel.cells == (m // 64) * (n // 64)
    assert kernel.waves == math.ceil(kernel.cells / (132 * kernel.occupancy))
    # Each distinct x row-panel and y column-panel read once (shared ones hit in L2), the output written once.
    assert kernel.bytes == m * k * 2 + k * n * 2 + m * n * 2
    assert kernel.dot_flops == 2 * m * n * k
    ref = model_gpu_reference(matmul_task, "h100")
    assert ref.kind == "xla" and est.kind == "pallas"


def test_more_warps_resident_is_not_slower(matmul_task: Task) -> None:
    few = model_gpu_candidate(triton_matmul_source(64, 64, 32, warps=4, stages=4), matmul_task, "a100")
    bandwidth_bound = model_gpu_candidate(triton_matmul_source(16, 16, 32, warps=4), matmul_task, "a100")
    # 16x16 tiles re-read the panels 4x as often per flop and run many more waves: modelled slower.
    assert bandwidth_bound.time_ms > few.time_ms
