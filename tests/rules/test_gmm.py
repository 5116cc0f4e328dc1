"""The grouped-matmul template: group metadata from the sizes at run time, correct across boundaries."""

from __future__ import annotations

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
    real = int(total[0])
    assert list(zip(group_of[:real].tolist(), tile_of[:real].tolist())) == expected
    assert len(group_of) == 4 + 8 - 1  # the static bound that sizes the grid
    assert (group_of[real:] == group_of[real - 1]).all() and (tile_of[real:] == tile_of[real - 1]).all()
    assert starts.tolist() == bounds[:-1].tolist() and ends.tolist() == bounds[1:].tolist()


def test_grouped_matmul_is_correct_across_group_boundaries_and_lowers(declared_size_evaluator) -> None:  # type: ignore[no-untyped-def]
    task = load_task("14p_Ragged_Dot")  # very unequal groups, one always empty, boundaries off the tiles
    assert GROUPED_MATMUL.applies(task, analyze_task(task)) is None
    source = GROUPED_MATMUL.render(task, {"block_m": 128, "block_k": 128, "block_n": 128}, ("cpu",))
    assert "PrefetchScalarGridSpec" in source and "Precision.HIGHEST" not in source
    report = declared_size_evaluator.evaluate(task, source)
    assert report.passed and report.label == "pallas-kernel", report.reason
    space = GROUPED_MATMUL.space(task, analyze_task(task, "tpu-v5e"), "tpu-v5e")
    assert all(b % 128 == 0 for b in space.space["block_k"] + space.space["block_n"])
    result = validate_tpu(GROUPED_MATMUL.render(task, space.defaults, ("cpu", "full")), task, "v5e")
    assert result.ok, result.reason
    assert result.vmem_bytes is not None and result.vmem_bytes <= result.vmem_budget_bytes
