"""The learned cost model: trained on measured configurations, it orders an unseen task's trials; it is
cached, trained again only as the store grows, and gives way to the hand-written order without data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from maxkernel.analysis.signature import TaskSignature, TensorSpec
from maxkernel.tuning import SearchSpace, tune_space
from maxkernel.tuning.learned import (
    ENV_SWITCH,
    LearnedCostModel,
    Sample,
    cached_model,
    enabled,
    model_path,
    task_features,
)
from jaxbench.report import EvalReport


def gemm(rows: int, cols: int) -> dict[str, float]:
    sig = TaskSignature(task_id=f"g{rows}", category="matmul", primitives=["dot_general", "add", "max"],
                        inputs=[TensorSpec(shape=[rows, cols], dtype="float32"), TensorSpec(shape=[cols, cols], dtype="float32")],
                        outputs=[TensorSpec(shape=[rows, cols], dtype="float32")])
    return task_features(sig)


def samples_where_mid_blocks_win(tasks: int = 3) -> list[Sample]:
    """On every task the block covering a quarter of the rows is fastest, the whole extent slowest,
    and the smallest block fails."""
    out = []
    for t in range(tasks):
        rows = 256 << t
        feats = gemm(rows, 128)
        for frac, speedup in ((1, 0.9), (2, 1.2), (4, 1.8), (8, 1.3), (16, None)):
            out.append(Sample(task=feats, strategy="template:rowblock", kind="template",
                              params={"block_rows": rows // frac}, extents={"block_rows": rows}, speedup=speedup,
                              group=f"g{rows}|template:rowblock"))
    return out


def test_it_learns_an_order_that_transfers_to_an_unseen_size() -> None:
    model = LearnedCostModel.fit(samples_where_mid_blocks_win())
    assert model is not None and model.groups == 3
    rows = 4096  # a task larger than any it was trained on
    configs = [{"block_rows": rows // f} for f in (1, 2, 4, 8, 16)]
    ranked = model.order(gemm(rows, 128), "template:rowblock", "template", configs, {"block_rows": rows})
    assert ranked[0] == {"block_rows": rows // 4}
    assert ranked[-1] == {"block_rows": rows // 16}  # the failing block size goes last
    predicted = model.predict(gemm(rows, 128), "template:rowblock", "template", configs, {"block_rows": rows})
    assert predicted[2] > 1.0 > predicted[4]  # faster than the typical configuration, and slower


def test_too_little_data_gives_no_model() -> None:
    assert LearnedCostModel.fit([]) is None
    assert LearnedCostModel.fit(samples_where_mid_blocks_win(tasks=1)) is None  # one group teaches no transfer
    lonely = [s.model_copy(update={"group": f"only{i}"}) for i, s in enumerate(samples_where_mid_blocks_win())]
    assert LearnedCostModel.fit(lonely) is None  # single configurations compare with nothing


def test_cached_until_the_store_grows(tmp_path: Path) -> None:
    path = model_path(tmp_path, "cpu")
    calls: list[int] = []

    def samples() -> list[Sample]:
        calls.append(1)
        return samples_where_mid_blocks_win()

    assert cached_model(path, 40, samples, retrain_every=10) is not None and len(calls) == 1
    assert cached_model(path, 49, samples, retrain_every=10) is not None and len(calls) == 1  # cached
    assert cached_model(path, 50, samples, retrain_every=10) is not None and len(calls) == 2  # grew by 10
    assert json.loads(path.with_suffix(".json").read_text())["store_size"] == 50

    empty = model_path(tmp_path, "tpu-v5e")
    assert cached_model(empty, 3, lambda: calls.append(1) or [], retrain_every=10) is None and len(calls) == 3
    assert cached_model(empty, 5, lambda: calls.append(1) or [], retrain_every=10) is None and len(calls) == 3


def test_a_damaged_cache_is_trained_again(tmp_path: Path) -> None:
    path = model_path(tmp_path, "cpu")
    assert cached_model(path, 40, samples_where_mid_blocks_win) is not None
    path.write_bytes(b"not a pickle")
    assert cached_model(path, 41, samples_where_mid_blocks_win) is not None
    assert isinstance(cached_model(path, 41, lambda: []), LearnedCostModel)  # the rewritten cache is readable


def test_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_SWITCH, raising=False)
    assert enabled()
    monkeypatch.setenv(ENV_SWITCH, "off")
    assert not enabled()


def test_tune_space_measures_in_the_given_order() -> None:
    seen: list[int] = []

    def evaluate(source: str) -> EvalReport:
        seen.append(int(source))
        return EvalReport(task="t", status="ok", correct=True, speedup=float(source))

    space = SearchSpace(params={"b": [1, 2, 3, 4]}, defaults={"b": 1})
    result = tune_space("s", space, lambda p: str(p["b"]), evaluate, "t", "cpu", 60, extents={"b": 4},
                        order=lambda cs: sorted(cs, key=lambda c: c["b"] % 3), patience=10)
    assert seen == [3, 1, 4, 2]
    assert result.best_params == {"b": 4}
    hand: list[int] = []
    tune_space("s", space, lambda p: str(p["b"]), lambda s: (hand.append(int(s)), evaluate(s))[1], "t", "cpu", 60,
               extents={"b": 4}, patience=10)
    assert hand[0] == 1 and hand[1] == 4  # without an order: the default first, then the fewest grid steps


def test_it_drafts_only_strategies_it_has_seen_measured() -> None:
    """A configuration picked for a strategy it never saw is a guess from other strategies' blocks: the
    strategy's own defaults stay its draft (ordering trials still uses the model)."""
    from actors.priors import draft_params, predictor
    from maxkernel.messages import StrategyRef

    model = LearnedCostModel.fit(samples_where_mid_blocks_win())
    assert model is not None and model.knows("template:rowblock") and not model.knows("template:fused_grid")
    rows = 4096
    space = {"block_rows": [rows // f for f in (1, 2, 4, 8, 16)]}
    seen = StrategyRef(name="template:rowblock", kind="template", params={"block_rows": rows}, space=space,
                       extents={"block_rows": rows})
    unseen = seen.model_copy(update={"name": "template:fused_grid"})
    for_strategy = predictor((model, gemm(rows, 128)))
    assert for_strategy(unseen) is None and for_strategy(seen) is not None
    drafted, notes = draft_params([seen, unseen], [], [], for_strategy)
    assert drafted[0].params == {"block_rows": rows // 4} and drafted[0].defaults == {"block_rows": rows}
    assert drafted[1] == unseen and len(notes) == 1  # left at its own defaults
