"""XLA code priced by XLA:TPU where the TPU compiler is installed, the fallback named where it is not, and the
fit's re-pricing of captured pieces equal to the model's own price."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from jaxbench.task import load_task
from maxkernel.targets import xla_tpu
from maxkernel.targets.calibration import REFERENCE, TASK_YAML, tiled_matmul_source
from maxkernel.targets.calibration_fit import Pieces, Prepared, capture_pieces, current_params
from maxkernel.targets.model import model_candidate, model_reference
from maxkernel.targets.specs import load_model_constants, load_tpu_spec


@pytest.fixture(scope="module")
def matmul_task():
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "mm"
        folder.mkdir()
        (folder / "task.yaml").write_text(TASK_YAML.format(n=4096))
        (folder / "reference.py").write_text(REFERENCE)
        yield load_task(folder)


@pytest.fixture
def no_compiler(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("MAXKERNEL_NO_TPU_COMPILER", "1")
    xla_tpu.tpu_compiler.cache_clear()
    yield
    xla_tpu.tpu_compiler.cache_clear()


def test_without_the_compiler_the_model_says_it_is_the_fallback(matmul_task, no_compiler) -> None:
    estimate = model_reference(matmul_task, "v6e")
    (note,) = [n for n in estimate.notes if "XLA program" in n]
    assert "FALLBACK" in note and xla_tpu.INSTALL_HINT in note and "XLA:CPU" in note


def test_a_program_xla_tpu_will_not_compile_is_priced_by_the_fallback_with_its_reason(
        matmul_task, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reference that needs more HBM than the chip has is refused by XLA:TPU's compiler: the session still
    gets a price (the fallback roofline), and the note says why the compiled program did not price it."""
    from maxkernel.targets import xla_cost

    def out_of_hbm(*args: object) -> None:
        raise RuntimeError("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
                           "temporaries (34.50G) exceeds available HBM (31.25G).\nmore lines")

    monkeypatch.setattr(xla_cost, "tpu_compiler", lambda generation: object())  # a compiler that is there
    monkeypatch.setattr(xla_cost, "program_cost", out_of_hbm)
    estimate = model_reference(matmul_task, "v6e")
    (note,) = [n for n in estimate.notes if "XLA program" in n]
    assert "FALLBACK" in note and "XLA:TPU did not compile it: RuntimeError: RESOURCE_EXHAUSTED" in note
    assert "more lines" not in note and estimate.time_ms > 0


@pytest.mark.skipif(not xla_tpu.compiler_installed(), reason="the TPU compiler (extra tpu-compiler) is not installed")
def test_with_the_compiler_xla_code_is_priced_by_its_compiled_program(matmul_task) -> None:
    xla_tpu.tpu_compiler.cache_clear()
    spec = load_tpu_spec("v6e")
    estimate = model_reference(matmul_task, "v6e")
    assert any("XLA:TPU's compiled program" in n for n in estimate.notes), estimate.notes
    ideal = 2.0 * 4096**3 / spec.peak_bf16_flops
    device_s = estimate.time_ms / 1e3 - load_model_constants().dispatch_overhead_s.value
    assert ideal <= device_s <= 3 * ideal  # a large bf16 matmul: near the MXU peak, never above it


def test_captured_pieces_reprice_exactly_as_the_model(matmul_task) -> None:
    estimate, pieces = capture_pieces(lambda: model_candidate(tiled_matmul_source(512, 1024, 1024), matmul_task, "v5e"))
    prepared = Prepared(Pieces.model_validate(pieces.model_dump(mode="json")))  # through JSON, as from the sandbox
    params = current_params("v5e")
    dispatch = load_model_constants().dispatch_overhead_s.value
    assert prepared.seconds(params) == pytest.approx(estimate.time_ms / 1e3 - dispatch, rel=1e-6)
    steps = sum(k.grid_steps * k.count for k in estimate.kernels)
    slower = params.model_copy(update={"step_overhead_s": params.step_overhead_s + 1e-6})
    assert prepared.seconds(slower) - prepared.seconds(params) == pytest.approx(steps * 1e-6, rel=1e-6)


def test_sentinels_are_counted_from_the_figure_not_from_every_custom_call() -> None:
    """The ragged paged attention reference compiled for v6e: seven non-Mosaic custom calls, optimal_seconds
    -0.99937 (one sentinel). Counting every custom call as one priced it at 6.0 s, a 1299x 'speedup'."""
    assert xla_tpu.without_sentinels(-0.99937, 7) == pytest.approx(0.00063)
    assert xla_tpu.without_sentinels(-1.9995, 3) == pytest.approx(0.0005)
    assert xla_tpu.without_sentinels(0.0042, 0) == 0.0042
    assert xla_tpu.without_sentinels(-999.9, 2) is None  # a Pallas kernel's -1000 s: not priced here


@pytest.mark.slow
@pytest.mark.skipif(not xla_tpu.compiler_installed(), reason="the TPU compiler (extra tpu-compiler) is not installed")
def test_a_reference_with_layout_helpers_is_priced_at_its_own_time() -> None:
    import functools

    import jax
    from jax._src import core

    from maxkernel.analysis.program import input_shapes, static_args

    task = load_task("7p_Ragged_Paged_Attention")
    closed = jax.make_jaxpr(functools.partial(task.reference, **static_args(task, "full")))(*input_shapes(task, "full"))
    device = xla_tpu.tpu_compiler("v6e")
    cost = xla_tpu.compiled_cost(core.jaxpr_as_fun(closed), [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in closed.in_avals], device)
    assert 1e-4 < cost.seconds < 0.1, cost  # its loop body once: 0.6 ms, not the 6.0 s of seven sentinels
