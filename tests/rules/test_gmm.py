"""The grouped-matmul template: group metadata from the sizes at run time, correct across boundaries."""

from __future__ import annotations

import pytest
import types

import numpy as np

from jaxbench.task import load_task
from maxkernel.analysis import analyze_task
from maxkernel.targets import validate_tpu
from maxkernel.templates.gmm import GROUPED_MATMUL


def _module(source: str) -> types.ModuleType:
    module = types.ModuleType("candidate")
    exec(compile(source, "candidate.py", "exec"), module.__dict__)
    return module


def test_metadata_visits_every_tile_and_group_that_share_a_row_in_order() -> None:
    task = load_task("14p_Ragged_Dot")
    module = _module(GROUPED_MATMUL.render(task, {"block_m": 128, "block_k": 256, "block_n": 128}, ("cpu",)))
    sizes = np.array([0, 130, 3, 0, 200, 179, 0, 0], np.int32)  # empty groups, one inside a tile
    group_of, tile_of, starts, ends, total = (np.asarray(x) for x in module._group_metadata(sizes, 512, 128))
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    expected = [(g, t) for g in range(8) for t in range(4)
                if sizes[g] and bounds[g] < (t + 1) * 128 and bounds[g + 1] > t * 128]
    real = int(total)
    assert list(zip(group_of[:real].tolist(), tile_of[:real].tolist())) == expected
    assert len(group_of) == 4 + 8 - 1  # the static bound that sizes the grid
    assert (group_of[real:] == group_of[real - 1]).all() and (tile_of[real:] == tile_of[real - 1]).all()
    assert starts.tolist() == bounds[:-1].tolist() and ends.tolist() == bounds[1:].tolist()


@pytest.mark.slow
def test_grouped_matmul_is_correct_across_group_boundaries_and_lowers(declared_size_evaluator) -> None:  # type: ignore[no-untyped-def]
    task = load_task("14p_Ragged_Dot")  # very unequal groups, one always empty, boundaries off the tiles
    assert GROUPED_MATMUL.applies(task, analyze_task(task)) is None
    # n is 384 at cpu size: two column tiles of 256, the last one half past the end.
    source = GROUPED_MATMUL.render(task, {"block_m": 128, "block_k": 128, "block_n": 256}, ("cpu",))
    assert "PrefetchScalarGridSpec" in source and "Precision.HIGHEST" not in source
    report = declared_size_evaluator.evaluate(task, source)
    assert report.passed and report.label == "pallas-kernel", report.reason
    space = GROUPED_MATMUL.space(task, analyze_task(task, "tpu-v5e"), "tpu-v5e")
    assert all(b % 128 == 0 for b in space.space["block_k"] + space.space["block_n"])
    result = validate_tpu(GROUPED_MATMUL.render(task, space.defaults, ("cpu", "full")), task, "v5e")
    assert result.ok, result.reason
    assert result.vmem_bytes is not None and result.vmem_bytes <= result.vmem_budget_bytes


@pytest.mark.slow
def test_tpu_default_tiles_have_a_checkable_twin_and_the_estimate_matches_the_check_size() -> None:
    """Tiles whose smallest twin needs more than CHECK_FLOPS would be refused: the default must not be one."""
    from maxkernel.targets.check_size import CHECK_FLOPS, derive_check_size
    from maxkernel.targets.loader import load_candidate
    from maxkernel.targets.specs import load_tpu_spec
    from maxkernel.templates.gmm import analyse, check_floors, check_footprint

    task = load_task("11p_Megablox_GMM")
    full, small = analyse(task, "full"), analyse(task, "cpu")
    assert not isinstance(full, str) and not isinstance(small, str)
    floors = check_floors(task, full, small)
    assert floors == (1, 512, 256)  # m is free; k and n stop at their cpu values
    for target in ("tpu-v5e", "tpu-v6e"):
        space = GROUPED_MATMUL.space(task, analyze_task(task, target), target)
        tiles = (space.defaults["block_m"], space.defaults["block_k"], space.defaults["block_n"])
        flops, steps = check_footprint(full, floors, *tiles)
        assert flops <= CHECK_FLOPS
        check = derive_check_size(load_candidate(GROUPED_MATMUL.render(task, space.defaults, ("cpu", "full"))),
                                  task, load_tpu_spec(target.removeprefix("tpu-")), interpreted=True)
        assert check.refusal is None, check.refusal
        # The estimate halves each dimension as the check does; its steps bound the check's (which counts the
        # visit axis, sized by the data, once).
        values = check.values
        assert flops == 2.0 * values["num_groups"] * values["m"] * values["k"] * values["n"]
        assert check.grid_steps <= steps and check.reference_flops is not None
        assert check.reference_flops <= flops * 1.01  # the dense estimate bounds the reference's count


def test_the_expert_tiles_are_checked_where_megablox_is_checked() -> None:
    """Column tiles may be partial, so the check halves n past where the tile stops dividing it: megablox's
    own tiles (512, 1024, 1024) get the check size of JAX's megablox gmm (n=1792), not n=7168 (1.2e11 FLOPs)."""
    from maxkernel.targets.check_size import CHECK_FLOPS, derive_check_size
    from maxkernel.targets.loader import load_candidate
    from maxkernel.targets.specs import load_tpu_spec
    from maxkernel.templates.gmm import analyse, check_floors, check_footprint

    task = load_task("11p_Megablox_GMM")
    full, small = analyse(task, "full"), analyse(task, "cpu")
    assert not isinstance(full, str) and not isinstance(small, str)
    tiles = {"block_m": 512, "block_k": 1024, "block_n": 1024}
    flops, steps = check_footprint(full, check_floors(task, full, small), *tiles.values())
    assert flops == 2.0 * 8 * 512 * 2048 * 1792 and flops <= CHECK_FLOPS
    check = derive_check_size(load_candidate(GROUPED_MATMUL.render(task, tiles, ("cpu", "full"))), task,
                              load_tpu_spec("v5e"), interpreted=True)
    assert check.refusal is None, check.refusal
    assert check.values == {"m": 512, "k": 2048, "n": 1792, "num_groups": 8} and check.grid_steps <= steps


@pytest.mark.slow
def test_the_grid_runs_only_the_real_visits() -> None:
    """14p always has an empty group, so its full inputs make fewer visits than the bound tiles + groups - 1:
    the modelled grid must run the real count (a static bound pays a step and a block fetch per padding visit)."""
    from maxkernel.targets.model import model_candidate
    from maxkernel.templates.gmm import analyse, visits

    task = load_task("14p_Ragged_Dot")
    full = analyse(task, "full")
    assert not isinstance(full, str)
    tiles = {"block_m": 512, "block_k": 1024, "block_n": 1024}
    estimate = model_candidate(GROUPED_MATMUL.render(task, tiles, ("cpu", "full")), task, "v5e")
    (kernel,) = estimate.kernels
    columns, visited, depth = kernel.grid
    assert (columns, depth) == (full.n // 1024, full.k // 1024)
    assert full.m // 512 <= visited < visits(full, 512)


def _interpreted(source: str) -> types.ModuleType:
    """The candidate with its pallas_call run in interpret mode on this CPU."""
    from jax.experimental import pallas as pl

    module = _module(source)
    pallas = types.SimpleNamespace(**{name: getattr(pl, name) for name in dir(pl) if not name.startswith("_")})
    pallas.pallas_call = lambda *args, **kwargs: pl.pallas_call(*args, interpret=True, **kwargs)
    module.pl = pallas
    return module


@pytest.mark.slow
def test_odd_row_counts_keep_the_tuned_tiles_over_padded_rows_and_match_the_reference() -> None:
    """No legal divisor near BLOCK_M divides 902, 518 or 37 rows: the rows are padded to whole tiles (a
    group boundary may fall anywhere, so padded rows are rows no group owns) instead of shrinking the tile."""
    import jax

    task = load_task("11p_Megablox_GMM")
    module = _interpreted(GROUPED_MATMUL.render(task, {"block_m": 128, "block_k": 512, "block_n": 256}, ("cpu",)))
    assert module._row_blocks(512) == (128, 512)  # the block rule where it serves
    assert module._row_blocks(480) == (96, 480)  # a legal divisor no smaller than half the tuned tile
    for rows, tiling in ((902, (128, 1024)), (518, (128, 640)), (37, (48, 48))):
        assert module._row_blocks(rows) == tiling
        (lhs, group_sizes, rhs), _ = task.module.get_inputs(jax.random.key(rows), m=rows, k=128, n=256, num_groups=8)
        got = np.asarray(module.kernel(lhs, group_sizes, rhs), np.float32)
        want = np.asarray(task.reference(lhs, group_sizes, rhs), np.float32)
        assert got.shape == (rows, 256)
        np.testing.assert_allclose(got, want, atol=2e-2, rtol=2e-2)


def test_a_depth_with_no_legal_block_is_refused_by_name_and_odd_rows_still_lower_for_tpu() -> None:
    import jax
    import jax.numpy as jnp
    import pytest

    task = load_task("11p_Megablox_GMM")
    source = GROUPED_MATMUL.render(task, {"block_m": 512, "block_k": 1024, "block_n": 1024}, ("cpu", "full"))
    assert "ROW_ALIGN = 16" in source and "DEPTH_ALIGN = 128" in source and "_fit(" not in source
    module = _module(source)
    rhs = jax.ShapeDtypeStruct((8, 1000, 512), jnp.bfloat16)
    with pytest.raises(ValueError, match="depth=1000 is not served"):
        module.kernel(jax.ShapeDtypeStruct((512, 1000), jnp.bfloat16), jax.ShapeDtypeStruct((8,), jnp.int32), rhs)
    # 902 rows: 1024 padded rows in tiles of 512, lowered for the TPU.
    exported = jax.export.export(jax.jit(module.kernel), platforms=["tpu"])(
        jax.ShapeDtypeStruct((902, 512), jnp.bfloat16), jax.ShapeDtypeStruct((8,), jnp.int32),
        jax.ShapeDtypeStruct((8, 512, 1024), jnp.bfloat16))
    assert exported.out_avals[0].shape == (902, 1024)
