"""Shared memory and registers per GPU program instance, by Triton's pipelining rule and Mosaic GPU's
buffering, checked on kernels traced here (no CUDA plugin needed) and on JAX's own GPU kernels."""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import pytest
from gpu_kernels import triton_matmul_source
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

from jaxbench.task import Task
from maxkernel.targets.gpu_blocks import ProgramShape, check_smem, program_shape
from maxkernel.targets.gpu_model import model_gpu_candidate
from maxkernel.targets.gpu_spec import load_gpu_spec
from maxkernel.targets.jaxpr_walk import find_pallas_calls

S = jax.ShapeDtypeStruct
BF16 = jnp.bfloat16
TILE = 64 * 32 * 2  # a (64, 32) or (32, 64) bf16 tile


def _shape(fn: Callable[..., Any], args: list[Any], chip: str) -> ProgramShape:
    (call,) = find_pallas_calls(jax.make_jaxpr(fn)(*args).jaxpr)
    return program_shape(call.eqn, load_gpu_spec(chip))


def _looped_matmul(rows: int, stages: int, use_pl_load: bool, warps: int = 4) -> Callable[..., Any]:
    """x (rows, 256) @ y (256, 64) in one program, K looped in 32-wide tiles."""

    def body(x_ref: Any, y_ref: Any, o_ref: Any) -> None:
        def step(i: Any, acc: Any) -> Any:
            cols, krows = (slice(None), pl.ds(i * 32, 32)), (pl.ds(i * 32, 32), slice(None))
            x = plt.load(x_ref.at[cols]) if use_pl_load else x_ref[cols]
            y = plt.load(y_ref.at[krows]) if use_pl_load else y_ref[krows]
            return acc + jnp.dot(x, y, preferred_element_type=jnp.float32)

        o_ref[...] = jax.lax.fori_loop(0, 8, step, jnp.zeros((rows, 64), jnp.float32)).astype(o_ref.dtype)

    return pl.pallas_call(body, out_shape=S((rows, 64), BF16),
                          compiler_params=plt.CompilerParams(num_warps=warps, num_stages=stages))


@pytest.mark.parametrize("use_pl_load", [False, True])
def test_dot_operands_in_a_loop_are_buffered_by_the_stages(use_pl_load: bool) -> None:
    # Hopper's 64-row wgmma reads its operands from shared memory: num_stages buffers each; an Ampere mma
    # num_stages - 1. plt.load (masked_load) is counted exactly as ref indexing (get) is.
    args = [S((64, 256), BF16), S((256, 64), BF16)]
    fn = _looped_matmul(64, 3, use_pl_load)
    hopper, ampere = _shape(fn, args, "h100"), _shape(fn, args, "a100")
    assert hopper.smem_bytes == 3 * 2 * TILE and hopper.register_bytes == 0
    assert ampere.smem_bytes == 2 * 2 * TILE


def test_a_dot_too_small_for_wgmma_gets_no_extra_buffer() -> None:
    # 16 output rows are no wgmma tile: an mma, num_stages - 1 buffers on Hopper too.
    args = [S((16, 256), BF16), S((256, 64), BF16)]
    shape = _shape(_looped_matmul(16, 3, True), args, "h100")
    assert shape.smem_bytes == 2 * (16 * 32 * 2 + 32 * 64 * 2)


def test_one_stage_pipelines_nothing() -> None:
    shape = _shape(_looped_matmul(64, 1, True), [S((64, 256), BF16), S((256, 64), BF16)], "h100")
    assert shape.smem_bytes == 2 * TILE


def _row_sum(stages: int) -> Callable[..., Any]:
    """Sums a (8, 4096) f32 input's columns in 512-wide blocks loaded by pl.load: no dot anywhere."""

    def body(x_ref: Any, o_ref: Any) -> None:
        def step(i: Any, acc: Any) -> Any:
            return acc + plt.load(x_ref.at[:, pl.ds(i * 512, 512)])

        o_ref[...] = jax.lax.fori_loop(0, 8, step, jnp.zeros((8, 512), jnp.float32))

    return pl.pallas_call(body, out_shape=S((8, 512), jnp.float32),
                          compiler_params=plt.CompilerParams(num_warps=4, num_stages=stages))


@pytest.mark.parametrize("chip", ["a100", "h100"])
def test_a_load_no_dot_reads_is_held_once_in_registers(chip: str) -> None:
    shape = _shape(_row_sum(4), [S((8, 4096), jnp.float32)], chip)
    assert shape.smem_bytes == 0
    assert shape.register_bytes == 8 * 512 * 4  # once, not num_stages deep


def test_dot_operands_outside_loops_and_in_outer_loops_pass_shared_memory_once() -> None:
    def body(x_ref: Any, y_ref: Any, o_ref: Any) -> None:
        x = plt.load(x_ref.at[...])  # outside any loop

        def outer(j: Any, acc: Any) -> Any:
            y = plt.load(y_ref.at[:, pl.ds(j * 64, 64)])  # in a loop that holds another loop
            inner = jax.lax.fori_loop(0, 2, lambda i, a: a + 1.0, acc)
            return inner + jnp.dot(x, y, preferred_element_type=jnp.float32)

        o_ref[...] = jax.lax.fori_loop(0, 4, outer, jnp.zeros((64, 64), jnp.float32)).astype(o_ref.dtype)

    fn = pl.pallas_call(body, out_shape=S((64, 64), BF16),
                        compiler_params=plt.CompilerParams(num_warps=4, num_stages=3))
    shape = _shape(fn, [S((64, 64), BF16), S((64, 256), BF16)], "h100")
    assert shape.smem_bytes == 64 * 64 * 2 + 64 * 64 * 2


def test_paged_indices_are_pipelined_one_level_up() -> None:
    # The page index is loaded and addresses a dot operand's load: both pipelined (levels 0 and 1 of 3 stages).
    def body(table_ref: Any, q_ref: Any, k_ref: Any, o_ref: Any) -> None:
        q = q_ref[...]

        def step(i: Any, acc: Any) -> Any:
            pages = plt.load(table_ref.at[pl.ds(i * 16, 16)])
            k = plt.load(k_ref.at[pages[0]])
            return acc + jnp.dot(q, k.T, preferred_element_type=jnp.float32)

        o_ref[...] = jax.lax.fori_loop(0, 4, step, jnp.zeros((64, 32), jnp.float32))

    fn = pl.pallas_call(body, out_shape=S((64, 32), jnp.float32),
                        compiler_params=plt.CompilerParams(num_warps=4, num_stages=3))
    shape = _shape(fn, [S((64,), jnp.int32), S((64, 128), BF16), S((8, 32, 128), BF16)], "a100")
    q, k, table = 64 * 128 * 2, 32 * 128 * 2, 16 * 4
    assert shape.smem_bytes == q + 2 * k + 2 * table


def test_mosaic_blocks_take_max_concurrent_steps_buffers_up_to_the_sequential_steps() -> None:
    pytest.importorskip("absl", reason='Pallas\' Mosaic GPU module needs absl-py: pip install -e ".[gpu]"')
    from jax.experimental.pallas import mosaic_gpu as plgpu

    def body(x_ref: Any, o_ref: Any) -> None:
        o_ref[...] = x_ref[...] * 2

    def call(**params: Any) -> Callable[..., Any]:
        return pl.pallas_call(body, grid=(4, 2), in_specs=[pl.BlockSpec((64, 128), lambda i, j: (i, j))],
                              out_specs=pl.BlockSpec((64, 128), lambda i, j: (i, j)),
                              out_shape=S((256, 256), BF16), compiler_params=plgpu.CompilerParams(**params))

    block = 64 * 128 * 2
    args = [S((256, 256), BF16)]
    assert _shape(call(), args, "h100").smem_bytes == 2 * block  # JAX's default: one buffer per block
    parallel = call(max_concurrent_steps=3)
    assert _shape(parallel, args, "h100").smem_bytes == 2 * block  # no sequential axis: one step at a time
    sequential = call(max_concurrent_steps=3, dimension_semantics=["parallel", "sequential"])
    assert _shape(sequential, args, "h100").smem_bytes == 2 * 2 * block  # capped at the 2 sequential steps


def _jax_gpu_kernels() -> dict[str, tuple[Callable[..., Any], list[Any]]]:
    from jax.experimental.pallas.ops.gpu import attention, decode_attention, layer_norm, rms_norm, softmax

    rows = [S((2, 64, 8192), jnp.float32), S((8192,), jnp.float32), S((8192,), jnp.float32)]
    return {
        "layer_norm": (layer_norm.layer_norm, rows),
        "rms_norm": (rms_norm.rms_norm, rows),
        "softmax": (softmax.softmax, [S((64, 8192), jnp.float32)]),
        "attention": (lambda q, k, v: attention.mha(q, k, v, None, causal=True), [S((2, 4096, 32, 128), BF16)] * 3),
        "decode_attention": (decode_attention.mqa,
                             [S((8, 32, 128), BF16), S((8, 4096, 128), BF16), S((8, 4096, 128), BF16)]),
    }


@pytest.mark.parametrize("chip", ["a100", "h100"])
@pytest.mark.parametrize("name", sorted(_jax_gpu_kernels()))
def test_jax_gpu_kernels_fit_at_their_default_blocks(name: str, chip: str) -> None:
    fn, args = _jax_gpu_kernels()[name]
    calls = find_pallas_calls(jax.make_jaxpr(fn)(*args).jaxpr)
    assert calls
    for call in calls:
        shape = check_smem(call.eqn, call.name, load_gpu_spec(chip))
        assert shape.backend == "triton"
        if name in ("layer_norm", "rms_norm", "softmax"):
            # No dot: every plt.load is held in registers, none in shared memory (rms_norm's and layer_norm's
            # in-loop f32 blocks taken num_stages = 3 deep would overflow the A100's 163 KB).
            assert shape.smem_bytes == 0 and shape.register_bytes > 0


def test_pl_load_and_ref_indexing_price_alike(matmul_task: Task) -> None:
    by_index = model_gpu_candidate(triton_matmul_source(64, 64, 32), matmul_task, "h100")
    by_pl_load = model_gpu_candidate(triton_matmul_source(64, 64, 32, pl_load=True), matmul_task, "h100")
    (a,), (b,) = by_index.kernels, by_pl_load.kernels
    assert b.smem_bytes == a.smem_bytes == 3 * 2 * TILE
    assert (b.flops, b.bytes, b.time_ms) == (a.flops, a.bytes, a.time_ms)
