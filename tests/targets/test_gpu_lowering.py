"""GPU lowering without a GPU: real Triton / Mosaic GPU lowering through jax.export with the CUDA plugin."""

from __future__ import annotations

import pytest
from gpu_kernels import mosaic_scale_source, triton_matmul_source

from jaxbench.task import Task
from maxkernel.targets.gpu_lowering import plugin_available, validate_gpu

pytestmark = pytest.mark.skipif(not plugin_available(), reason='needs the CUDA plugin: pip install -e ".[gpu]"')


@pytest.mark.parametrize("chip", ["a100", "h100"])
def test_triton_matmul_lowers_and_fits(matmul_task: Task, chip: str) -> None:
    result = validate_gpu(triton_matmul_source(64, 64, 32, stages=3), matmul_task, chip)
    assert result.ok, result.reason
    assert result.backends == ["triton"] and result.pallas_calls == 1
    # k loop: x tile (64, 32) and y tile (32, 64), bf16, pipelined by 3 stages: 2 buffers each for an
    # Ampere mma, 3 for Hopper's wgmma (a 64-row tile), which reads its operands from shared memory.
    buffers = {"a100": 2, "h100": 3}[chip]
    assert result.smem_bytes == buffers * (64 * 32 * 2 + 32 * 64 * 2)


def test_block_shape_triton_rejects_is_a_lowering_failure_with_its_message(matmul_task: Task) -> None:
    source = triton_matmul_source(48, 64, 32)
    result = validate_gpu(source, matmul_task, "h100")
    assert not result.ok and result.stage == "lowering"
    assert "power of 2" in result.reason and "(48, 32)" in result.reason


def test_shared_memory_overflow_is_refused_per_chip(matmul_task: Task) -> None:
    # 4 stages of (128, 128) and (128, 128) bf16 tiles: 3 buffers each on an A100 (192 KiB), above its 163 KB;
    # 4 on an H100 (256 KiB), above its 227 KB.
    result = validate_gpu(triton_matmul_source(128, 128, 128, stages=4), matmul_task, "a100")
    assert not result.ok and result.stage == "smem"
    assert result.smem_bytes == 3 * 2 * 128 * 128 * 2 and result.smem_budget_bytes == 163 * 1024
    hopper = validate_gpu(triton_matmul_source(128, 128, 128, stages=4), matmul_task, "h100")
    assert not hopper.ok and hopper.stage == "smem" and hopper.smem_bytes == 4 * 2 * 128 * 128 * 2
    # 3 stages (2 buffers, 128 KiB) fit the A100's 163 KB.
    assert validate_gpu(triton_matmul_source(128, 128, 128, stages=3), matmul_task, "a100").ok


def test_mosaic_gpu_is_refused_on_ampere_only(matmul_task: Task) -> None:
    source = mosaic_scale_source(64, 128)
    hopper = validate_gpu(source, matmul_task, "h100")
    assert hopper.ok, hopper.reason
    assert hopper.backends == ["mosaic"]
    # Input and output block, one buffer each (max_concurrent_steps' default, and the grid has no sequential axis).
    assert hopper.smem_bytes == 2 * (64 * 128 * 2)
    ampere = validate_gpu(source, matmul_task, "a100")
    assert not ampere.ok and ampere.stage == "backend" and "compute capability" in ampere.reason


def test_mosaic_gpu_shared_memory_overflow_is_mosaics_own_error(matmul_task: Task) -> None:
    # Mosaic GPU stages whole blocks in shared memory: (64, 2048) bf16 blocks of x and of the output overflow.
    source = mosaic_scale_source(64, 2048)
    result = validate_gpu(source, matmul_task, "h100")
    assert not result.ok and result.stage == "lowering" and "shared memory" in result.reason
