"""Template failures found on computations written outside the suite: a row-block template must refuse a
reference it cannot index by rows (a per-batch mask beside [batch, rows, cols] logits) instead of emitting a
kernel that fails to trace, and the MLP template must choose blocks whose priced code has a twin small enough
to check on a large GeGLU."""

from __future__ import annotations

from pathlib import Path

import pytest

from jaxbench.task import load_task
from maxkernel.analysis import analyze_task
from maxkernel.targets.check_size import CHECK_FLOPS
from maxkernel.templates.rowblock import RowBlockTemplate
from maxkernel.templates.tpu_mlp import CHECK_SHARE, TpuMlpTemplate, check_flops, plan
from maxkernel.templates.tpu_rows import TpuRowsTemplate

ROOT = Path(__file__).resolve().parents[2]
MASKED_SOFTMAX = ROOT / "benchmarks" / "generality_tasks" / "masked_softmax_temperature"
SHORT_CONV = ROOT / "benchmarks" / "generality_tasks" / "mamba_causal_conv1d_silu"
GEGLU = ROOT / "benchmarks" / "generality_tasks" / "geglu_mlp"


def _masked_rows(folder: Path, mask_rank: int) -> Path:
    """softmax(where(mask, x, -inf)) over [batch, rows, cols]; the mask per batch ([batch, cols]) or per row."""
    folder.mkdir(parents=True, exist_ok=True)
    shape = "(batch, cols)" if mask_rank == 2 else "(batch, rows, cols)"
    index = "keep[:, None, :]" if mask_rank == 2 else "keep"
    (folder / "task.yaml").write_text(f"""\
id: {folder.name}
name: {folder.name}
category: normalization
description: masked softmax over the last axis.
dtype: float32
tolerance: {{atol: 1.0e-5, rtol: 1.0e-5}}
sizes:
  cpu: {{batch: 2, rows: 64, cols: 1024}}
  full: {{batch: 8, rows: 256, cols: 4096}}
""")
    (folder / "reference.py").write_text(f"""\
import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, rows, cols):
    k1, k2 = jax.random.split(key)
    x = jax.random.normal(k1, (batch, rows, cols), jnp.float32)
    keep = jax.random.bernoulli(k2, 0.9, {shape}).at[..., 0].set(True)
    return (x, keep), {{}}


def reference(x, keep):
    return jax.nn.softmax(jnp.where({index}, x, -jnp.inf), axis=-1)
""")
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("template", [TpuRowsTemplate(), RowBlockTemplate()], ids=lambda t: t.name)
def test_row_block_templates_refuse_an_input_read_whole_but_indexed_by_a_row_axis(template: object,
                                                                                 tmp_path: Path) -> None:
    # A per-batch mask beside [batch, rows, cols] logits; per-channel filters beside [batch, channels, time].
    for folder in (MASKED_SOFTMAX, _masked_rows(tmp_path / "per_batch_mask", 2), SHORT_CONV):
        task = load_task(folder)
        reason = template.applies(task, analyze_task(task, "tpu-v6e"))  # type: ignore[attr-defined]
        assert reason is not None and "indexed by the row axes" in reason, reason
    # Inputs that share every row axis, or none (a norm's weight), run on a block as on the whole: still served.
    norm = load_task("12p_RMSNorm")
    assert template.applies(norm, analyze_task(norm, "tpu-v6e")) is None  # type: ignore[attr-defined]
    if template.name == "rowblock":  # it blocks inputs of any dtype: a mask of every row is blocked too
        per_row = load_task(_masked_rows(tmp_path / "per_row_mask", 3))
        assert template.applies(per_row, analyze_task(per_row, "tpu-v6e")) is None  # type: ignore[attr-defined]


def test_a_large_geglu_gets_mlp_blocks_whose_twin_is_small_enough_to_check() -> None:
    task = load_task(GEGLU)
    template = TpuMlpTemplate()
    assert template.applies(task, analyze_task(task, "tpu-v6e")) is None
    space = template.space(task, None, "tpu-v6e")  # type: ignore[arg-type]
    p, small = plan(task, ("full",)), plan(task, ("cpu",))
    assert not isinstance(p, str) and not isinstance(small, str)
    assert space.space["block_m"] and space.space["block_h"]
    for bm in space.space["block_m"]:
        for bh in space.space["block_h"]:
            assert check_flops(p, bm, bh, small.hidden) <= CHECK_SHARE * CHECK_FLOPS
    # The widest row block VMEM allows (1024) would need a twin of 2048 rows: past the check's FLOP limit.
    assert check_flops(p, 1024, 128, small.hidden) > CHECK_FLOPS


@pytest.mark.slow
def test_the_large_geglu_kernel_is_checkable_at_its_derived_check_size() -> None:
    from maxkernel.targets.sandboxed import run_tpu_stage

    task = load_task(GEGLU)
    template = TpuMlpTemplate()
    source = template.render(task, template.space(task, None, "tpu-v6e").defaults, ("cpu", "full"))  # type: ignore[arg-type]
    stage = run_tpu_stage(task.path, source, "v6e", timeout_s=300)
    assert stage.failure is None and (stage.lowering or {}).get("ok"), stage.failure
    assert stage.check is not None and stage.check.refusal is None, stage.check
    assert (stage.check.reference_flops or 0) <= CHECK_FLOPS
