"""Tuning: pruned space, seeded order, stopping rules, and a database that never crowns a failure."""

from __future__ import annotations

from jaxbench.report import EvalReport
from maxkernel.tuning import SearchSpace, tune_space
from maxkernel.tuning.database import Database, Trial
from maxkernel.tuning.strategy import order


def _fake_evaluate(speed: dict[int, float]):  # type: ignore[no-untyped-def]
    def evaluate(source: str) -> EvalReport:
        block = int(source)
        if block not in speed:
            return EvalReport(task="t", status="incorrect", reason="wrong")
        return EvalReport(task="t", status="ok", correct=True, speedup=speed[block])

    return evaluate


def test_order_is_seeded_and_puts_the_default_first() -> None:
    configs = SearchSpace(params={"block_rows": [8, 16, 32, 64]}, defaults={"block_rows": 16}).configs()
    assert configs[0] == {"block_rows": 16}
    a = order(configs, {"block_rows": 64}, "cpu", seed=1)
    assert a == order(configs, {"block_rows": 64}, "cpu", seed=1)
    assert a[0] == {"block_rows": 16} and a[1] == {"block_rows": 64}  # then fewest grid steps first


def test_tuner_finds_the_best_and_stops_without_improvement() -> None:
    space = SearchSpace(params={"block_rows": [1, 2, 4, 8, 16, 32]}, defaults={"block_rows": 32})
    speed = {32: 0.9, 16: 1.3, 8: 1.1, 4: 1.0, 2: 0.5}  # 1 fails
    result = tune_space("template:x", space, lambda p: str(p["block_rows"]), _fake_evaluate(speed), "t", "cpu",
                        budget_s=60, extents={"block_rows": 32}, patience=2)
    assert result.best_params == {"block_rows": 16}
    assert result.stopped == "no_improvement" and len(result.trials) == 4


def test_tuner_respects_max_trials_and_budget() -> None:
    space = SearchSpace(params={"b": [1, 2, 3, 4]}, defaults={"b": 1})
    ev = _fake_evaluate({1: 1.0, 2: 2.0, 3: 3.0, 4: 4.0})
    assert tune_space("s", space, lambda p: str(p["b"]), ev, "t", "cpu", 60, max_trials=2).stopped == "max_trials"
    assert tune_space("s", space, lambda p: str(p["b"]), ev, "t", "cpu", 0.0).trials == []


def test_database_best_ignores_failed_and_incorrect_trials() -> None:
    db = Database()
    db.add(Trial(strategy="a", report=EvalReport(task="t", status="incorrect", speedup=9.0)))
    db.add(Trial(strategy="b", report=EvalReport(task="t", status="ok", correct=True, speedup=1.2)))
    best = db.best()
    assert best is not None and best.strategy == "b"


def test_pricing_orders_the_whole_space_by_modelled_time_and_checks_the_cheapest_first() -> None:
    from maxkernel.tuning.pricing import rank_by_price

    modelled = {1: 4.0, 2: 1.0, 3: None, 4: 2.0, 5: 3.0}  # 3 does not lower
    configs = [{"b": b} for b in (1, 2, 3, 4, 5)]
    ranked, ms = rank_by_price(configs, lambda p: str(p["b"]), lambda s: modelled[int(s)], budget_s=60)
    assert [c["b"] for c in ranked] == [2, 4, 5, 1, 3] and ms == {0: 1.0, 1: 2.0, 2: 3.0, 3: 4.0}
    unpriced, none = rank_by_price(configs, lambda p: str(p["b"]), lambda s: modelled[int(s)], budget_s=0.0)
    assert unpriced == configs and none == {}
    # The tuner checks in that order: the modelled best that is correct wins, then patience ends the search.
    space = SearchSpace(params={"b": [1, 2, 3, 4, 5]}, defaults={"b": 1})
    speed = {1: 1.0, 4: 2.0, 5: 1.5}  # 2 is cheapest but incorrect
    result = tune_space("s", space, lambda p: str(p["b"]), _fake_evaluate(speed), "t", "tpu-v5e", 60,
                        patience=2, price=lambda s: modelled[int(s)])
    assert [t.params["b"] for t in result.trials] == [2, 4, 5, 1]
    assert result.best_params == {"b": 4} and result.modelled_ms[:2] == [1.0, 2.0]
