"""Region tasks as the planner and the TPU judge see them: the reference is a sound candidate (the baseline),
its parameters are named and it takes no static, the attention core is cut where the flash template reads it,
scalar constants are folded, and every region holds programs for the check ladder between cpu and full."""

from __future__ import annotations

import pytest
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp

from jaxbench.static_checks import scan
from jaxbench.task import load_task
from maxkernel.analysis import analyze_task
from maxkernel.analysis.program import Const, ProgramBuilder, arg_names, input_shapes, static_args
from maxkernel.extract import extract_task
from maxkernel.extract.constants import fold_constant_scalars
from maxkernel.extract.splice import own_sizes, splice
from maxkernel.extract.tasks import shared_function, shared_statics, sized_function
from maxkernel.rules.strategy import reference_source
from maxkernel.templates.attention import FLASH_ATTENTION, FlashAttentionTemplate, plan
from maxkernel.templates.masks import CAUSAL
from orchestrators.model_opt import _shapes

SMALLEST = "mamba2_block"


def test_region_references_are_sound_candidates_with_named_parameters(tmp_path):
    extraction = extract_task(SMALLEST, tmp_path, timing=False)
    for info in extraction.regions:
        region = load_task(info.path)
        findings, _ = scan(reference_source(region))
        assert findings == [], (info.task_id, [str(f) for f in findings])
        assert arg_names(region) == info.inputs  # templates name a kernel's arguments after these
        _, static = region.get_inputs(jax.random.key(0), "cpu")
        assert static == {}  # the arguments' shapes pick the size, so templates see no string static


def test_attention_core_is_the_one_flash_attention_reads(tmp_path):
    extraction = extract_task("llama31_8b_decoder", tmp_path, timing=False)
    core = next(r for r in extraction.regions if r.kind == "attention")
    region = load_task(core.path)
    assert FlashAttentionTemplate().applies(region, analyze_task(region)) is None
    q, k, v = input_shapes(region, "cpu")
    assert q.shape == k.shape == v.shape  # the kv-head repeat stays in the projection region before it
    # At full (seq 8192) the causal mask, built from [seq, seq] iotas, is matched too: a TPU session
    # reaches the template instead of stopping at a mask too large to evaluate node by node.
    found = plan(region, ("cpu", "full"))
    assert not isinstance(found, str) and found.mask is CAUSAL, found


def test_scalars_made_of_constants_are_folded():
    closed = jax.make_jaxpr(lambda x: x / jnp.sqrt(jnp.float32(64.0)))(jnp.ones((4, 4), jnp.float32))
    program = ProgramBuilder().build(closed, ["x"])
    assert fold_constant_scalars(program) >= 1
    assert [n.prim for n in program.nodes] == ["div"]
    scale = program.nodes[0].ins[1]
    assert isinstance(scale, Const) and scale.scalar() == 8.0


def test_regions_and_the_spliced_layer_trace_at_every_rung_of_the_check_ladder(tmp_path):
    layer = load_task(SMALLEST)
    extraction = extract_task(layer, tmp_path, timing=False)
    rungs = [s for s in extraction.sizes if s not in ("cpu", "full")]
    assert rungs and all(s.startswith("seq_") for s in rungs)
    namespace: dict[str, object] = {}
    exec(compile(splice(extraction, {}, _shapes(layer, extraction)), "layer_candidate.py", "exec"), namespace)  # noqa: S102
    for size in rungs:  # traced only (abstract shapes): the rungs run up to the full model dimensions
        sized = layer.with_size(size, extraction.sizes[size])
        args, static = input_shapes(sized, size), static_args(sized, size)
        got = jax.eval_shape(namespace["kernel"], *args, **static)
        want = jax.eval_shape(partial(layer.reference, **static), *args)
        assert (got.shape, got.dtype) == (want.shape, want.dtype)
        for info in extraction.regions:
            region = load_task(info.path).with_size(size, extraction.sizes[size])
            jax.eval_shape(region.reference, *input_shapes(region, size))  # the region has a program for the rung


@pytest.mark.slow
def test_regions_left_as_reference_run_fulls_code_at_widths_never_traced(tmp_path):
    """A region left as its reference runs the code emitted at ``full``: shapes read from its arguments, and
    extents no argument has (heads, the kv-head group) from the layer's size parameters. So the spliced layer
    also runs, and computes the layer, with its width shrunk to sizes extraction never traced: what a TPU
    check finds below ``full`` is the code priced there."""
    layer = load_task("llama31_8b_decoder")
    extraction = extract_task(layer, tmp_path, timing=False)
    # head_dim 64 at full's code: RoPE's half-width and /head_dim and the softmax scale follow head_dim
    unseen = {"batch": 1, "seq": 64, "hidden": 256, "heads": 4, "kv_heads": 2, "head_dim": 64, "intermediate": 256}
    assert unseen not in extraction.sizes.values()
    projections = Path(extraction.regions[0].path, "reference.py").read_text()
    assert {"heads", "kv_heads"} <= set(shared_statics(projections))  # the group is heads // kv_heads
    _assert_layer_at(layer, extraction, unseen)


@pytest.mark.slow
def test_an_extent_equal_to_another_at_the_traced_sizes_is_written_from_the_one_it_follows(tmp_path):
    """Qwen3 at ``full``: seq = heads * head_dim = 4096 and top_k = heads // kv_heads = 8; at ``cpu``
    seq = hidden = heads * head_dim = 256. Written from the wrong one, full's code would not trace (or would
    repeat kv heads top_k times) at a width where they differ; probes at ``cpu`` with one parameter doubled
    tell them apart."""
    layer = load_task("qwen3_moe_layer")
    extraction = extract_task(layer, tmp_path, timing=False)
    projections = Path(extraction.regions[0].path, "reference.py").read_text()
    assert set(shared_statics(projections)) == {"heads", "kv_heads"}  # the kv group, never top_k
    output = Path(extraction.regions[2].path, "reference.py").read_text()
    assert "def _region_" not in output  # one function for every size: the heads' width read from wo
    unseen = {"batch": 1, "seq": 64, "hidden": 384, "heads": 8, "kv_heads": 2, "head_dim": 32, "experts": 4,
              "intermediate": 96, "top_k": 3}
    _assert_layer_at(layer, extraction, unseen)


def _assert_layer_at(layer, extraction, unseen):
    """The layer spliced from region references, run at ``unseen`` (a size never traced), computes the layer."""
    sized = layer.with_size("unseen", unseen)
    namespace: dict[str, object] = {}
    exec(compile(splice(extraction, {}, _shapes(layer, extraction)), "layer_candidate.py", "exec"), namespace)  # noqa: S102
    args, static = sized.get_inputs(jax.random.key(1), "unseen")
    got = jax.jit(partial(namespace["kernel"], **static))(*args)
    want = jax.jit(partial(layer.reference, **static))(*args)
    tol = layer.spec.tolerance
    assert got.shape == want.shape
    assert bool(jnp.allclose(got.astype(jnp.float32), want.astype(jnp.float32), atol=tol.atol, rtol=tol.rtol))


def test_a_size_written_otherwise_keeps_a_function_of_its_own():
    """The scale 1/sqrt(head_dim) is a folded constant: a size with another head_dim cannot run full's code."""
    def attention_scale(x):
        return x / jnp.sqrt(jnp.float32(x.shape[-1]))

    programs = {}
    for size, dim in (("cpu", 64), ("full", 128), ("seq_4", 128)):
        closed = jax.make_jaxpr(attention_scale)(jnp.ones((4, dim), jnp.float32))
        programs[size] = ProgramBuilder().build(closed, ["x"])
        fold_constant_scalars(programs[size])
    shared, own = shared_function(programs, "_region", "doc")
    assert list(own) == ["cpu"]
    assert "def _region(" in shared and "def _region_cpu(" in own["cpu"]
    assert own_sizes(own["cpu"]) == ["cpu"]
    # Written as what it follows, the scale is sqrt of the argument's last axis: one function for both.
    shared, own, used = sized_function(programs, "_region", "doc", {size: {} for size in programs})
    assert own == {} and used == [] and "x_dim1 ** 0.5" in shared, shared


@pytest.mark.slow
def test_gemma2_attention_core_reaches_flash_with_its_soft_cap_and_sliding_window(tmp_path, declared_size_evaluator):
    """Gemma 2's core (scores soft-capped by 50 * tanh(s / 50), then a causal window of ``window`` keys)
    is the flash template's: the window is the region's static argument, the cap a named constant, and the
    schedule skips the key blocks wholly outside the window."""
    extraction = extract_task("gemma2_9b_layer", tmp_path, timing=False)
    core = next(r for r in extraction.regions if r.kind == "attention")
    region = load_task(core.path)
    _, static = region.get_inputs(jax.random.key(0), "cpu")
    assert static == {"window": 64}
    assert FLASH_ATTENTION.applies(region, analyze_task(region)) is None
    source = FLASH_ATTENTION.render(region, {"block_q": 64, "block_k": 64}, ("cpu",))
    assert "SOFT_CAP = 50.0" in source and "(cols <= rows) & (rows - cols < window)" in source
    namespace: dict[str, object] = {}
    exec(compile(source, "flash.py", "exec"), namespace)  # noqa: S102
    q_blocks, _, _ = namespace["_schedule"](256, 256, 64, 64, window=64)  # type: ignore[operator]
    assert len(q_blocks) == 7  # each query block sees itself and the block before: 3 of causal's 10 skipped
    report = declared_size_evaluator.evaluate(region, source)
    assert report.passed and report.label == "pallas-kernel", report.reason


@pytest.mark.slow
def test_deepseek_latent_attention_core_reaches_flash_with_its_parts_joined(tmp_path, declared_size_evaluator):
    """DeepSeek's scores are the sum of the plain and the RoPE parts' products, the RoPE key one per token
    shared by every head: the core is cut with the five parts and the values as its arguments, and the flash
    template computes it from the parts joined along the head dimension; the evaluator passes it."""
    extraction = extract_task("deepseek_v3_layer", tmp_path, timing=False)
    core = next(r for r in extraction.regions if r.kind == "attention")
    assert len(core.inputs) == 5
    region = load_task(core.path)
    assert FLASH_ATTENTION.applies(region, analyze_task(region)) is None
    found = plan(region, ("cpu", "full"))
    assert not isinstance(found, str) and found.joined is not None and found.mask is CAUSAL, found
    source = FLASH_ATTENTION.render(region, {"block_q": 128, "block_k": 128}, ("cpu",))
    assert "_joined([" in source
    report = declared_size_evaluator.evaluate(region, source)
    assert report.passed and report.label == "pallas-kernel", report.reason


@pytest.mark.slow
def test_mamba2_scan_region_reaches_the_chunked_scan_with_its_code_around_it(tmp_path, declared_size_evaluator):
    """Mamba-2's scan region (the causal convolution, the split of the packed projection, softplus and the
    decay, then a step-by-step scan): ``tpu_ssd`` keeps the region's code before and after the scan and runs
    the chunked kernel in its place; the evaluator passes it."""
    extraction = extract_task(SMALLEST, tmp_path, timing=False)
    stepped = next(r for r in extraction.regions if r.kind == "scan")
    region = load_task(stepped.path)
    from maxkernel.templates.tpu_ssd import TPU_SSD

    assert TPU_SSD.applies(region, analyze_task(region)) is None
    # the region's slices are literals at each size: each size's code is picked by the arguments' shapes
    source = TPU_SSD.render(region, {"chunk": 64, "block_h": 8, "passes": 1}, ("cpu", "full"))
    assert "def _stages(shapes):" in source and "_ssd(x, dt, log_decay, b, c, 0.0)" in source
    findings, _ = scan(source)
    assert findings == [], [str(f) for f in findings]
    report = declared_size_evaluator.evaluate(region, source)
    assert report.passed and report.label == "pallas-kernel", report.reason
