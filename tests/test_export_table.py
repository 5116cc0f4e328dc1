"""The tuned table exported kernels carry and parameter priors read, and the block rule beside it."""

from __future__ import annotations

import pytest

from maxkernel.tuning.table import TunedTable, block_for, lookup, shape_class
from memory.insights import Measurement


def row(task: str, params: dict, speedup: float | None, extents: dict, target: str = "cpu",
        status: str = "ok") -> Measurement:
    return Measurement(task_id=task, target=target, strategy="template:rowblock", kind="template", params=params,
                       extents=extents, space={"block_rows": [64, 128, 256, 512]}, status=status,
                       correct=status == "ok", speedup=speedup)


def test_shape_classes_round_each_extent_to_its_power_of_two() -> None:
    assert shape_class({"block_rows": 1400, "block_k": 300}) == "block_k~256,block_rows~1024"
    assert shape_class({"block_rows": 1500}) == "block_rows~2048"  # 2^10.55
    assert shape_class({}) == "any"


def test_the_table_keeps_the_best_passing_configuration_per_chip_and_shape_class() -> None:
    rows = [row("a", {"block_rows": 256}, 1.4, {"block_rows": 1024}),
            row("a", {"block_rows": 512}, 1.9, {"block_rows": 1024}),
            row("a", {"block_rows": 64}, None, {"block_rows": 1024}, status="compile_error"),
            row("a", {"block_rows": 128}, 3.0, {"block_rows": 1024}, status="incorrect"),
            row("a", {"block_rows": 64}, 1.1, {"block_rows": 4096}),
            row("a", {"block_rows": 128}, 2.2, {"block_rows": 1024}, target="tpu-v6e"),
            row("b", {"block_rows": 64}, 9.0, {"block_rows": 1024})]
    keyed = TunedTable.from_rows(rows).keyed("template:rowblock", "a")
    assert keyed == {("cpu", "block_rows~1024"): {"block_rows": 512}, ("cpu", "block_rows~4096"): {"block_rows": 64},
                     ("tpu-v6e", "block_rows~1024"): {"block_rows": 128}}
    assert lookup(keyed, "cpu", {"block_rows": 3000}) == {"block_rows": 64}  # the nearest class
    assert lookup(keyed, "cpu", {"block_rows": 900}) == {"block_rows": 512}
    assert lookup(keyed, "tpu-v5e", {"block_rows": 900}) is None  # never tuned on that chip


def test_the_block_rule_takes_the_largest_legal_divisor_under_the_tuned_block() -> None:
    assert block_for(1000, 256) == 250
    assert block_for(1000, 256, align=8) == 200
    assert block_for(96, 256, align=8) == 96  # a whole extent no larger than the block
    assert block_for(4096, 512, align=128) == 512
    with pytest.raises(ValueError, match=r"rows=1001 is not served: .*multiple of 8"):
        block_for(1001, 256, align=8, what="rows")
    with pytest.raises(ValueError, match=r"seq=997 is not served: .*between 32 and 128"):
        block_for(997, 128, smallest=32, what="seq")  # a prime: only blocks of 1, far below what was tuned
