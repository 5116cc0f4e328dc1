"""TPU lowering validation without a TPU: real Mosaic lowering through jax.export on this CPU."""

from __future__ import annotations

import pytest
from target_kernels import (
    PLAIN_JAX_RMSNORM,
    SEVEN_BY_SEVEN,
    matmul_source,
    rmsnorm_source,
)

from jaxbench.task import Task
from maxkernel.targets import GENERATIONS, load_candidate, validate_tpu
from maxkernel.targets.loader import CandidateLoadError

MIB = 2**20
# Tiled matmul (256, 256, 512), bf16: x and y blocks 256 KiB and output block 128 KiB, each double-buffered,
# plus the 256x256 f32 accumulator (single buffer).
MATMUL_VMEM = 2 * (256 * 512 * 2) + 2 * (512 * 256 * 2) + 2 * (256 * 256 * 2) + 256 * 256 * 4
# RMSNorm over all 4096 rows at once: x and out blocks 16 MiB each, weight 4 KiB, all double-buffered.
WHOLE_RMSNORM_VMEM = 2 * (16 * MIB) + 2 * 4096 + 2 * (16 * MIB)


def _line_of(source: str, needle: str) -> int:
    return next(i for i, text in enumerate(source.splitlines(), 1) if needle in text)


@pytest.mark.parametrize("generation", ["v5e", "v6e"])
def test_aligned_matmul_lowers(matmul_task: Task, generation: str) -> None:
    result = validate_tpu(matmul_source(256, 256, 512), matmul_task, generation)
    assert result.ok, result.reason
    assert result.stage is None and result.reason == ""
    assert result.target == f"tpu-{generation}"
    assert result.pallas_calls == 1
    assert result.vmem_bytes == MATMUL_VMEM
    assert result.vmem_budget_bytes == {"v5e": 16 * MIB, "v6e": 32 * MIB}[generation]


def test_matmul_lowers_for_every_generation(matmul_task: Task) -> None:
    for generation in GENERATIONS:
        assert validate_tpu(matmul_source(256, 256, 512), matmul_task, generation).ok, generation


def test_seven_by_seven_block_is_rejected_with_the_mosaic_message(rmsnorm_task: Task) -> None:
    result = validate_tpu(SEVEN_BY_SEVEN, rmsnorm_task, "v5e")
    assert not result.ok
    assert result.stage == "lowering"
    assert "divisible by 8 and 128" in result.error
    assert result.block_shape == "(7, 7)" and result.operand == "args[0]"
    assert result.line == _line_of(SEVEN_BY_SEVEN, "in_specs=[pl.BlockSpec((7, 7)")
    assert "pl.BlockSpec((7, 7)" in (result.line_text or "")
    assert "(7, 7)" in result.reason and f"candidate line {result.line}" in result.reason
    assert "\n" not in result.reason


def test_plain_jax_candidate_lowers_to_hlo(rmsnorm_task: Task) -> None:
    result = validate_tpu(PLAIN_JAX_RMSNORM, rmsnorm_task, "v6e")
    assert result.ok, result.reason
    assert result.pallas_calls == 0 and result.vmem_bytes is None


def test_over_budget_vmem_is_rejected_and_a_raised_limit_is_honoured(rmsnorm_task: Task) -> None:
    whole = rmsnorm_source(4096)
    result = validate_tpu(whole, rmsnorm_task, "v5e")
    assert not result.ok and result.stage == "vmem"
    assert (result.vmem_bytes, result.vmem_budget_bytes) == (WHOLE_RMSNORM_VMEM, 16 * MIB)
    assert result.line == _line_of(whole, "return pl.pallas_call(")
    # v5e has 128 MiB of VMEM: a 100 MiB limit fits; v7 has 64 MiB, so the same limit is capped there.
    raised = rmsnorm_source(4096, vmem_limit=100 * MIB)
    assert validate_tpu(raised, rmsnorm_task, "v5e").ok
    capped = validate_tpu(raised, rmsnorm_task, "v7")
    assert capped.stage == "vmem" and capped.vmem_budget_bytes == 64 * MIB


def test_load_failures_name_the_line(rmsnorm_task: Task) -> None:
    syntax = validate_tpu("import jax\ndef kernel(x, w, *, eps:\n    return x\n", rmsnorm_task, "v5e")
    assert syntax.stage == "load" and syntax.line == 2 and "SyntaxError" in syntax.reason
    missing = validate_tpu("import jax\nKERNEL = None\n", rmsnorm_task, "v5e")
    assert missing.stage == "load" and "kernel()" in missing.reason


def test_trace_error_points_at_the_candidate_line(rmsnorm_task: Task) -> None:
    source = PLAIN_JAX_RMSNORM.replace("return x * inv * w", "return x @ w.reshape(4, -1)")
    result = validate_tpu(source, rmsnorm_task, "v5e")
    assert result.stage == "trace" and result.error_type == "TypeError"
    assert result.line == _line_of(source, "w.reshape(4, -1)")


def test_unsupported_kernel_op_points_at_its_line(rmsnorm_task: Task) -> None:
    source = rmsnorm_source(256).replace("o_ref[...] = x * jax.lax.rsqrt(ms + eps) * w_ref[...]",
                                         "o_ref[...] = jnp.sort(x, axis=0) * w_ref[...]")
    result = validate_tpu(source, rmsnorm_task, "v5e")
    assert result.stage == "lowering"
    assert "sort" in result.error
    assert result.line == _line_of(source, "jnp.sort(x, axis=0)")


def test_each_load_is_a_fresh_module() -> None:
    source = "import jax\n\nCALLS = []\n\ndef kernel(x):\n    CALLS.append(1)\n    return x\n"
    first, second = load_candidate(source), load_candidate(source)
    first.kernel(1)
    assert first is not second and first.CALLS == [1] and second.CALLS == []
    with pytest.raises(CandidateLoadError):
        load_candidate("def helper():\n    return 1\n")


PAGED_TASK = {
    "task.yaml": "id: head_pages\nname: head_pages\ncategory: gather\n"
                 "description: one kv head of one page of a paged cache, for every head\n"
                 "dtype: bfloat16\ntolerance: {atol: 1.0e-6, rtol: 1.0e-6}\n"
                 "sizes:\n  cpu: {pages: 4, page: 16, heads: 8, dim: 128}\n  full: {pages: 64, page: 16, heads: 8, dim: 128}\n",
    "reference.py": '''import jax
import jax.numpy as jnp


def get_inputs(key, *, pages, page, heads, dim):
    cache = jax.random.normal(key, (pages, page, heads, dim), jnp.float32).astype(jnp.bfloat16)
    return (cache, jnp.array([pages - 1], jnp.int32)), {}


def reference(cache, which):
    return jnp.transpose(cache[which[0]], (1, 0, 2))
''',
}


def _head_copy_source(index: str) -> str:
    """A kernel that DMAs one head of one page per grid step: ``index`` is the HBM slice it copies."""
    return f'''import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def _copy(which_ref, cache_hbm, o_ref, buf, sem):
    h = pl.program_id(0)
    copy = pltpu.make_async_copy({index}, buf, sem)
    copy.start()
    copy.wait()
    o_ref[...] = buf[...].reshape(o_ref.shape)


def kernel(cache, which):
    pages, page, heads, dim = cache.shape
    return pl.pallas_call(
        _copy,
        out_shape=jax.ShapeDtypeStruct((heads, page, dim), cache.dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(heads,),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec((1, page, dim), lambda h, which: (h, 0, 0)),
            scratch_shapes=[pltpu.VMEM((page, dim), cache.dtype), pltpu.SemaphoreType.DMA(())]),
    )(which, cache)
'''


def test_the_tpu_compile_refuses_what_lowering_lets_through(tmp_path, monkeypatch, matmul_task) -> None:  # type: ignore[no-untyped-def]
    """One bf16 head of a page cache laid out [pages, page, heads, dim] sits at a dynamic offset along a
    tiled axis: export lowering accepts its DMA, Mosaic's compile for the chip refuses it (with
    ``MAXKERNEL_TPU_COMPILE=1`` and the TPU compiler installed), as the chip would; an aligned tiled matmul
    compiles."""
    from target_kernels import matmul_source, write_task

    from jaxbench.task import load_task
    from maxkernel.targets.xla_tpu import compiler_installed

    if not compiler_installed():
        pytest.skip("the TPU compiler (the tpu-compiler extra) is not installed")
    monkeypatch.delenv("MAXKERNEL_NO_TPU_COMPILER", raising=False)
    task = load_task(write_task(tmp_path / "head_pages", PAGED_TASK))
    misaligned = _head_copy_source("cache_hbm.at[which_ref[0], :, h]")
    lowered = validate_tpu(misaligned, task, "v6e")
    assert lowered.ok and not lowered.compiled  # lowering alone lets it through
    monkeypatch.setenv("MAXKERNEL_TPU_COMPILE", "1")
    refused = validate_tpu(misaligned, task, "v6e")
    assert not refused.ok and refused.stage == "compile" and "aligned to tiles" in refused.reason, refused.reason
    aligned = validate_tpu(matmul_source(128, 128, 128), matmul_task, "v6e")
    assert aligned.ok and aligned.compiled, aligned.reason
