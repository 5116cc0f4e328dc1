"""Strategy and parameter priors from memory: the pure rules, then the same read from a real store."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from actors.brains.base import FixedDraft, Tools
from actors.brains.rules import RulesBrain
from actors.config import ActorConfig
from actors.priors import (
    draft_params,
    first_then,
    model_pick,
    order_strategies,
    param_start,
    prioritize,
    scale_params,
    snap,
    strategy_priors,
    tiled_extents,
    tuning_priors,
)
from actors.services import Services
from jaxbench import load_task
from maxkernel.config import Settings
from maxkernel.messages import OptimizeRequest, Plan, Recall, StrategyRef
from maxkernel.tuning import learned
from measured_sessions import record_session
from memory import Memory
from memory.insights import Measurement, StrategyOutcome, TaskMatch

RECALLED = StrategyRef(name="recall:k1", kind="recalled")
ROWBLOCK = StrategyRef(name="template:rowblock", kind="template", params={"block_rows": 128},
                       space={"block_rows": [64, 128, 256, 512]}, extents={"block_rows": 512})
TAIL = StrategyRef(name="template:fused_tail", kind="template")
EPILOGUE = StrategyRef(name="template:matmul_epilogue", kind="template")
REWRITE = StrategyRef(name="rewrite:cheaper_activations", kind="rewrite")
REF = StrategyRef(name="reference", kind="reference")


def outcome(task: str, sim: float, strategy: str, best: float | None, won: bool = False) -> StrategyOutcome:
    return StrategyOutcome(task_id=task, similarity=sim, strategy=strategy, kind="template", evaluations=2,
                           passed=0 if best is None else 2, best_speedup=best, won=won,
                           reason="" if best is not None else "compile_error: block does not divide")


def test_winners_first_failures_last_reference_stays_last() -> None:
    priors = strategy_priors([outcome("a", 0.9, "template:matmul_epilogue", 2.0, won=True),
                              outcome("a", 0.9, "template:fused_tail", None),
                              outcome("b", 0.5, "template:fused_tail", None)])
    ordered, notes = order_strategies([RECALLED, TAIL, REWRITE, EPILOGUE, REF], priors)
    assert [s.name for s in ordered] == ["recall:k1", "template:matmul_epilogue", "rewrite:cheaper_activations",
                                         "template:fused_tail", "reference"]
    assert "won on a (similarity 0.90) at 2.00x" in ordered[1].rationale
    assert "failed on a" in ordered[3].rationale and "does not divide" in ordered[3].rationale
    assert ordered[2].rationale == ""  # memory knows nothing of it: left alone
    assert "template:matmul_epilogue" in notes and "template:fused_tail" in notes


def test_the_nearest_task_weighs_most() -> None:
    # Won on a distant task, failed on a close one: it goes behind a strategy memory knows nothing of.
    priors = strategy_priors([outcome("far", 0.2, "template:fused_tail", 3.0, won=True),
                              outcome("near", 0.95, "template:fused_tail", None)])
    assert priors["template:fused_tail"].score < 0
    assert priors["template:fused_tail"].reasons[0].startswith("failed on near")
    ordered, _ = order_strategies([TAIL, REWRITE], priors)
    assert [s.name for s in ordered] == ["rewrite:cheaper_activations", "template:fused_tail"]
    # Without memory the order is the planner's own.
    assert order_strategies([TAIL, REWRITE, REF], {})[0] == [TAIL, REWRITE, REF]


def test_a_combination_of_rewrites_borrows_the_prior_of_its_parts() -> None:
    priors = strategy_priors([outcome("a", 0.9, "rewrite:idle_subgraphs+cheaper_activations", 1.8, won=True),
                              outcome("a", 0.9, "template:fused_tail", 1.2)])
    combo = StrategyRef(name="rewrite:cheaper_activations+dead_code", kind="rewrite")
    other = StrategyRef(name="rewrite:dead_code", kind="rewrite")
    ordered, _ = order_strategies([other, TAIL, combo], priors)
    # The fused tail passed there but lost to the rewrite (1.2x against 1.8x): it goes behind the
    # rewrite memory knows nothing of.
    assert [s.name for s in ordered] == [combo.name, other.name, TAIL.name]
    assert "where the best reached 1.80x" in ordered[2].rationale
    assert "as rewrite:idle_subgraphs+cheaper_activations: won on a" in ordered[0].rationale


def test_a_failed_combination_says_nothing_of_its_parts() -> None:
    # Four rewrites together were refused on a similar task; two of them alone were measured slower there.
    priors = strategy_priors([outcome("a", 0.8, "rewrite:dead_code+idle_subgraphs+cheaper_activations", None),
                              outcome("a", 0.8, "template:tpu_gemm", 1.7, won=True),
                              outcome("a", 0.8, "rewrite:dead_code", 1.0),
                              outcome("a", 0.8, "rewrite:cheaper_activations", 1.0)])
    idle = StrategyRef(name="rewrite:idle_subgraphs", kind="rewrite")
    pair = StrategyRef(name="rewrite:cheaper_activations+dead_code", kind="rewrite")
    ordered, _ = order_strategies([idle, pair, TAIL], priors)
    assert ordered[0].prior is None and ordered[0].rationale == ""  # only the failed combination shares a part
    assert ordered[2].name == pair.name and ordered[2].prior is not None and ordered[2].prior < 0
    # ...it borrows from the two that passed (and lost), not from the failed combination
    assert "as rewrite:dead_code" in ordered[2].rationale and "failed on" not in ordered[2].rationale
    assert [s.name for s in ordered] == [idle.name, TAIL.name, pair.name]


def test_a_combination_is_not_sent_back_for_a_part_while_another_is_unknown() -> None:
    """``pool_into_weights`` (never measured) may be what does the work: the loss of ``cheaper_activations``
    elsewhere does not send the pair behind the strategies memory knows nothing of."""
    priors = strategy_priors([outcome("a", 0.8, "template:rowblock", 1.7, won=True),
                              outcome("a", 0.8, "rewrite:cheaper_activations", 0.7)])
    pair = StrategyRef(name="rewrite:pool_into_weights+cheaper_activations", kind="rewrite")
    ordered, _ = order_strategies([pair, TAIL], priors)
    assert [s.name for s in ordered] == [pair.name, TAIL.name] and ordered[0].prior is None


def test_a_win_within_noise_moves_nothing() -> None:
    priors = strategy_priors([outcome("a", 0.9, "template:fused_tail", 1.05, won=True),
                              outcome("a", 0.9, "template:matmul_epilogue", 0.97)])
    ordered, notes = order_strategies([REWRITE, TAIL, EPILOGUE], priors)
    assert [s.name for s in ordered] == [REWRITE.name, TAIL.name, EPILOGUE.name]
    assert "won on a" in ordered[1].rationale  # the reason is still told


def test_snap_picks_the_nearest_legal_value() -> None:
    assert snap(50, [8, 16, 32, 64]) == 64  # nearest in log scale
    assert snap(2 ** 4.5, [16, 32]) == 16  # a tie goes to the smaller block
    assert snap(24, [16, 32]) == 32
    assert snap(1000, [64, 128]) == 128 and snap(1, [64, 128]) == 64  # clipped to the legal range
    assert snap("fast", ["fast", "slow"]) == "fast" and snap("other", ["fast"]) is None
    assert snap(True, [True, False]) is True


def test_recalled_blocks_keep_their_share_of_the_extent() -> None:
    space = {"block_rows": [128, 256, 512, 1024], "order": ["ij", "ji"], "unroll": [1, 2]}
    scaled = scale_params({"block_rows": 256, "order": "ji", "unroll": 8, "other": 3},
                          {"block_rows": 1024}, {"block_rows": 4096}, space)
    assert scaled == {"block_rows": 1024, "order": "ji", "unroll": 2}  # 256 of 1024 -> 1024 of 4096
    assert scale_params({"block_rows": 512}, {"block_rows": 512}, {"block_rows": 100},
                        {"block_rows": [8, 16, 32, 64, 128]}) == {"block_rows": 128}  # a whole extent stays whole
    assert tiled_extents({}, {"block_m": [64, 128, 256], "flag": [True]}) == {"block_m": 256}


def measured(task: str, params: dict, speedup: float | None, extents: dict | None = None) -> Measurement:
    return Measurement(task_id=task, target="cpu", strategy=ROWBLOCK.name, kind="template", params=params,
                       extents=extents or {"block_rows": 1024}, space={"block_rows": [128, 256, 512, 1024]},
                       status="ok" if speedup else "compile_error", correct=bool(speedup), speedup=speedup)


def test_tuning_starts_from_the_most_similar_tasks_best_params() -> None:
    rows = [measured("near", {"block_rows": 512}, 1.5), measured("near", {"block_rows": 1024}, 1.2),
            measured("near", {"block_rows": 256}, None), measured("far", {"block_rows": 128}, 3.0)]
    matches = [TaskMatch(task_id="near", score=0.9), TaskMatch(task_id="far", score=0.3)]
    start, why = param_start(rows, matches, ROWBLOCK) or ({}, "")
    assert start == {"block_rows": 256}  # 512 of 1024 there is half of this task's 512
    assert "near" in why and "1.50x" in why
    assert param_start(rows, [], ROWBLOCK) is None  # nothing similar measured
    assert param_start(rows, matches, TAIL) is None  # nothing to tune
    same = [measured("near", {"block_rows": 256}, 1.5)]  # scales to the defaults: nothing new to say
    assert param_start(same, matches, ROWBLOCK) is None
    slower = [measured("near", {"block_rows": 512}, 0.95)]  # never beat the reference there: no start
    assert param_start(slower, matches, ROWBLOCK) is None
    assert param_start(slower + [measured("far", {"block_rows": 128}, 3.0)], matches, ROWBLOCK)[0] == \
        {"block_rows": 64}  # the less similar task whose configuration did beat it


def test_trial_order_puts_the_start_first_then_the_ranking() -> None:
    configs = [{"b": 1}, {"b": 2}, {"b": 3}, {"b": 4}]
    order = first_then({"b": 2}, lambda cs: sorted(cs, key=lambda c: -c["b"]))
    assert order is not None and order(configs) == [{"b": 2}, {"b": 4}, {"b": 3}, {"b": 1}]
    unstarted = first_then(None, lambda cs: list(reversed(cs)))
    assert unstarted is not None and unstarted(configs) == list(reversed(configs))
    assert first_then({"b": 2}, None) is None  # the hand-written order already measures the start first


# -- read from a real store ------------------------------------------------------------------------

GEMMS = ("41k_Gemm_Add_ReLU", "35k_Gemm_Scaling_Hardtanh_GELU", "44k_Matmul_Divide_GELU")


@pytest.fixture
def memory(tmp_path: Path):
    with Memory.open(Settings(data_dir=str(tmp_path / "data"))) as m:
        yield m


def test_prioritize_reads_outcomes_of_similar_tasks(memory: Memory) -> None:
    record_session(memory.store, GEMMS[0], [TAIL, EPILOGUE, REF],
                   {"template:fused_tail": ("runtime_error", None), "template:matmul_epilogue": ("ok", 1.6)})
    record_session(memory.store, "12p_RMSNorm", [TAIL, REF], {"template:fused_tail": ("ok", 2.0)})
    task = load_task(GEMMS[2])
    ordered, notes = prioritize(memory, task, "cpu", [TAIL, REWRITE, EPILOGUE, REF])
    # On the nearest task (a GEMM) the epilogue template won and the fused tail failed; the norm
    # task where the fused tail won is further away.
    assert [s.name for s in ordered] == ["template:matmul_epilogue", "rewrite:cheaper_activations",
                                         "template:fused_tail", "reference"]
    assert f"won on {GEMMS[0]}" in ordered[0].rationale and "Memory on template:matmul_epilogue" in notes
    # Another target's memory says nothing about this one.
    assert prioritize(memory, task, "tpu-v5e", [TAIL, REWRITE]) == ([TAIL, REWRITE], "")


class Broken:
    def __getattr__(self, name: str):
        raise RuntimeError("store unreachable")


def test_memory_that_cannot_be_read_changes_nothing(tmp_path: Path) -> None:
    task = load_task(GEMMS[2])
    assert prioritize(Broken(), task, "cpu", [TAIL, REF]) == ([TAIL, REF], "")  # type: ignore[arg-type]
    assert tuning_priors(Broken(), tmp_path, task, ROWBLOCK, "cpu") == (ROWBLOCK, None)  # type: ignore[arg-type]


def _tuned_sessions(memory: Memory) -> None:
    """Two GEMM tasks where the rowblock template ran fastest with the smallest block (the opposite of
    the hand-written order, which on ``cpu`` puts the fewest grid steps first)."""
    for task in GEMMS[:2]:
        trials = [({"block_rows": b}, "ok", s) for b, s in ((64, 1.6), (128, 1.1), (256, 0.8), (512, 0.5))]
        record_session(memory.store, task, [ROWBLOCK, REF], {"template:rowblock": ("ok", 0.9)},
                       tuned={"template:rowblock": trials})


def test_tuning_priors_start_and_order(memory: Memory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _tuned_sessions(memory)
    task = load_task(GEMMS[2])
    here = ROWBLOCK.model_copy(update={"params": {"block_rows": 128}, "space": {"block_rows": [32, 64, 128, 256]},
                                       "extents": {"block_rows": 256}})
    monkeypatch.setenv(learned.ENV_SWITCH, "off")
    start, order = tuning_priors(memory, tmp_path, task, here, "cpu")
    assert start.params == {"block_rows": 32}  # 64 of 512 there: 32 of 256 here
    assert "memory:" in start.rationale and order is None  # no model: the hand-written order, start first

    monkeypatch.setenv(learned.ENV_SWITCH, "on")
    start, order = tuning_priors(memory, tmp_path, task, here, "cpu")
    assert order is not None
    ranked = order([{"block_rows": b} for b in (128, 256, 32, 64)])
    assert ranked[0] == {"block_rows": 32}  # the recalled start first
    assert ranked[1:] == [{"block_rows": 64}, {"block_rows": 128}, {"block_rows": 256}]  # smaller blocks won there
    assert learned.model_path(tmp_path, "cpu").exists()


def test_the_rules_planner_orders_its_plan_by_memory(tmp_path: Path) -> None:
    services = Services(ActorConfig(data_dir=str(tmp_path / "data")))
    try:
        rowblock = StrategyRef(name="template:rowblock", kind="template")
        record_session(services.store, GEMMS[0], [rowblock, EPILOGUE, REF],
                       {"template:rowblock": ("compile_error", None), "template:matmul_epilogue": ("ok", 2.0)})

        async def unused(*_: object) -> None:
            raise AssertionError("planning evaluates nothing")

        tools = Tools(task=services.task(GEMMS[2]), target="cpu", size="cpu", evaluate=unused, recall=unused)  # type: ignore[arg-type]
        request = OptimizeRequest(session_id="s", task_id=GEMMS[2])
        outcome = asyncio.run(RulesBrain("planner", services, tools).plan(request, Recall(session_id="s", task_id=GEMMS[2])))
    finally:
        asyncio.run(services.aclose())
    names = [s.name for s in outcome.strategies]
    assert names[0] == "template:matmul_epilogue" and names[-2:] == ["template:rowblock", "reference"]
    assert f"won on {GEMMS[0]}" in outcome.strategies[0].rationale
    assert "Memory on template:rowblock" in outcome.notes and "failed on" in outcome.notes


# -- transfer through the rules planner: strategy and parameters from a similar task ------------------

ROW41 = StrategyRef(name="template:rowblock", kind="template", params={"block_rows": 512},
                    space={"block_rows": [32, 64, 128, 256, 512]}, extents={"block_rows": 512})
EPI41 = StrategyRef(name="template:matmul_epilogue", kind="template",
                    params={"block_m": 512, "block_n": 1024, "block_k": 2048},
                    space={"block_m": [256, 512], "block_n": [512, 1024], "block_k": [1024, 2048]},
                    extents={"block_rows": 512})


def _plan(services: Services, task_id: str):
    async def unused(*_: object) -> None:
        raise AssertionError("planning evaluates nothing")

    tools = Tools(task=services.task(task_id), target="cpu", size="cpu", evaluate=unused, recall=unused)  # type: ignore[arg-type]
    brain = RulesBrain("planner", services, tools)
    request = OptimizeRequest(session_id="s", task_id=task_id)
    return brain, asyncio.run(brain.plan(request, Recall(session_id="s", task_id=task_id)))


def test_a_similar_tasks_tuned_winner_is_drafted_first_at_its_parameters(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(learned.ENV_SWITCH, "off")  # the recalled parameters alone decide the draft
    services = Services(ActorConfig(data_dir=str(tmp_path / "data")))
    try:
        _, cold = _plan(services, GEMMS[2])
        # On 41k the rowblock template won once tuned to 128-row blocks; the epilogue template passed but lost.
        record_session(services.store, GEMMS[0], [ROW41, EPI41, TAIL, REF],
                       {"template:rowblock": ("ok", 1.1), "template:matmul_epilogue": ("ok", 1.05),
                        "template:fused_tail": ("ok", 0.5)},
                       tuned={"template:rowblock": [({"block_rows": 128}, "ok", 1.9), ({"block_rows": 256}, "ok", 1.3)]})
        brain, warm = _plan(services, GEMMS[2])
        first = warm.strategies[0]
        source = asyncio.run(brain.draft(Plan(session_id="s", task_id=GEMMS[2], strategies=warm.strategies)))
        from maxkernel.rules import render

        at_recalled = render(services.task(GEMMS[2]), _strategy(first), {"block_rows": 128})
        at_defaults = render(services.task(GEMMS[2]), _strategy(first), {"block_rows": 512})
        # Memory's parameters that fail here (a check over the limits, say) fall back to the strategy's own.
        from jaxbench.report import EvalReport as JudgeReport
        from maxkernel.messages import FixRequest, KernelDraft

        plan = Plan(session_id="s", task_id=GEMMS[2], strategies=warm.strategies)
        refused = JudgeReport(task=GEMMS[2], target="cpu", size="full", status="rejected",
                              reason="no check size under the limits")
        drafted = KernelDraft(session_id="s", task_id=GEMMS[2], candidate_id="c1", plan=plan, source=source)
        fallback = asyncio.run(brain.fix(FixRequest(session_id="s", task_id=GEMMS[2], draft=drafted, report=refused)))
        at_own = plan.model_copy(update={"strategies": [first.model_copy(update={"params": first.defaults,
                                                                                 "defaults": {}})]})
        no_more = asyncio.run(brain.fix(FixRequest(session_id="s", task_id=GEMMS[2], report=refused,
                                                   draft=drafted.model_copy(update={"plan": at_own}))))
    finally:
        asyncio.run(services.aclose())
    assert cold.strategies[0].name == "rewrite:cheaper_activations"  # without memory: the planner's own order
    assert next(s for s in cold.strategies if s.name == "template:rowblock").params == {"block_rows": 512}
    assert [s.name for s in warm.strategies] == ["template:rowblock", "rewrite:cheaper_activations",
                                                 "template:matmul_epilogue", "template:fused_tail", "reference"]
    assert first.params == {"block_rows": 128}  # 128 of 512 rows there, 512 rows here
    assert type(first.params["block_rows"]) is int  # a block size, not the scaled float
    assert f"won on {GEMMS[0]}" in first.rationale and "1.90x" in first.rationale
    assert source == at_recalled and source != at_defaults  # the first draft is written at those parameters
    assert first.defaults == {"block_rows": 512}
    assert isinstance(fallback, FixedDraft) and fallback.params == {"block_rows": 512} and fallback.source == at_defaults
    assert "failed (rejected)" in fallback.why
    assert no_more is None  # at its own parameters already: no fix is known, the strategy is given up
    # The debugger sends the redraft with a plan at those parameters, the other strategies untouched.
    from actors.debugger import plan_with

    carried = plan_with(plan, fallback)
    assert carried.current.params == {"block_rows": 512} and carried.current.defaults == {}
    assert carried.strategies[1:] == plan.strategies[1:] and plan.current.params == {"block_rows": 128}
    loser = warm.strategies[2]
    assert "without winning, where the best reached 1.90x" in loser.rationale
    assert "drafted at {'block_rows': 128}" in warm.notes


def _strategy(ref: StrategyRef):
    from actors.brains.rules import _strategy as as_strategy

    return as_strategy(ref)


def test_a_strategy_that_failed_on_a_similar_task_is_demoted(tmp_path: Path) -> None:
    services = Services(ActorConfig(data_dir=str(tmp_path / "data")))
    try:
        record_session(services.store, GEMMS[0], [ROW41, EPI41, REF],
                       {"template:rowblock": ("compile_error", None), "template:matmul_epilogue": ("ok", 1.4)})
        _, warm = _plan(services, GEMMS[2])
    finally:
        asyncio.run(services.aclose())
    names = [s.name for s in warm.strategies]
    assert names[0] == "template:matmul_epilogue"
    assert names.index("template:rowblock") > names.index("rewrite:cheaper_activations")  # behind the unknown
    assert names[-1] == "reference"
    row = warm.strategies[names.index("template:rowblock")]
    assert "failed on" in row.rationale and "does not divide" in row.rationale
    assert row.params == {"block_rows": 512}  # nothing passed there: no parameters to carry over


def test_neighbours_of_another_op_family_count_half(memory: Memory) -> None:
    record_session(memory.store, GEMMS[0], [TAIL, REF], {"template:fused_tail": ("ok", 1.2)})
    record_session(memory.store, "12p_RMSNorm", [TAIL, REF], {"template:fused_tail": ("ok", 2.0)})
    query = memory.signature(GEMMS[2])
    cosine = {t: float(memory.embedder.embed(query) @ memory.embedder.embed(memory.signature(t)))
              for t in (GEMMS[0], "12p_RMSNorm")}
    scores = {m.task_id: m.score for m in memory.similar_tasks(GEMMS[2], k=5)}
    assert scores[GEMMS[0]] == pytest.approx(cosine[GEMMS[0]])  # a matmul like the query: its full similarity
    assert scores["12p_RMSNorm"] == pytest.approx(cosine["12p_RMSNorm"] * 0.5)  # no matmul: half


def test_the_learned_model_picks_the_draft_only_when_clearly_ahead() -> None:
    ref = ROWBLOCK  # defaults 128 of [64, 128, 256, 512]
    gains = {64: 1.0, 128: 1.0, 256: 1.3, 512: 0.7}

    def predict(configs: list[dict]) -> list[float]:
        return [gains[c["block_rows"]] for c in configs]

    drafted, notes = draft_params([ref, TAIL], [], [], lambda _ref: predict)
    assert drafted[0].params == {"block_rows": 256} and "learned cost model" in drafted[0].rationale
    assert drafted[1] == TAIL and len(notes) == 1  # nothing to tune: left alone
    gains[256] = 1.05  # within one measurement's noise of the defaults: they stay
    assert model_pick(ref, predict) is None
    assert draft_params([ref], [], [], None) == ([ref], [])
    # A recalled start wins over the model's pick.
    rows = [measured("near", {"block_rows": 512}, 1.5)]
    recalled, _ = draft_params([ref], rows, [TaskMatch(task_id="near", score=0.9)], lambda _ref: predict)
    assert recalled[0].params == {"block_rows": 256} and "scaled from" in recalled[0].rationale


def test_tuning_starts_where_the_plan_drafted() -> None:
    drafted = {"block_rows": 256, "note": "kept"}  # a parameter outside the space does not hide the start
    order = first_then(drafted, lambda cs: sorted(cs, key=lambda c: c["block_rows"]))
    assert order is not None
    assert order([{"block_rows": b} for b in (512, 64, 256, 128)]) == [
        {"block_rows": 256}, {"block_rows": 64}, {"block_rows": 128}, {"block_rows": 512}]


@pytest.mark.slow
def test_on_tpu_a_rewrite_that_won_on_a_similar_task_is_worked_before_the_pallas_kernels(tmp_path: Path) -> None:
    """The plan's prior travels to the work order: on ``tpu-*`` the Pallas-first rule no longer undoes it."""
    from actors.policy import order_kind, work_order

    target, task_id = "tpu-v6e", "27k_Matmul_Mish_Mish"
    services = Services(ActorConfig(data_dir=str(tmp_path / "data")))
    try:
        async def unused(*_: object) -> None:
            raise AssertionError("planning evaluates nothing")

        def plan() -> list[StrategyRef]:
            tools = Tools(task=services.task(task_id), target=target, size="cpu", evaluate=unused, recall=unused)  # type: ignore[arg-type]
            request = OptimizeRequest(session_id="s", task_id=task_id, target=target)
            outcome = asyncio.run(RulesBrain("planner", services, tools).plan(request, Recall(session_id="s", task_id=task_id)))
            return work_order(outcome.strategies, lambda ref: order_kind(ref.kind, ref.name), target, lambda ref: ref.prior)

        cold = plan()
        assert cold[0].kind != "rewrite" and cold[0].prior is None  # no memory: Pallas first
        # On a similar matmul task the activation rewrite won clearly and the Pallas GEMM lost to it.
        rewrite = StrategyRef(name="rewrite:idle_subgraphs+cheaper_activations", kind="rewrite", target=target)
        gemm = StrategyRef(name="template:tpu_gemm", kind="template", target=target)
        record_session(services.store, "47k_Matmul_Add_Swish_Tanh_GELU_Hardtanh", [rewrite, gemm, REF],
                       {rewrite.name: ("ok", 3.0), gemm.name: ("ok", 1.2)}, target=target)
        warm = plan()
    finally:
        asyncio.run(services.aclose())
    names = [s.name for s in warm]
    assert names[0] == rewrite.name and warm[0].prior is not None and warm[0].prior > 0
    assert names.index("template:tpu_gemm") > names.index("template:matmul_epilogue")  # lost there: behind the unknown
    assert warm[names.index("template:tpu_gemm")].prior < 0


def test_readings_within_their_noise_of_par_rank_nothing() -> None:
    """On a task where nothing cleared the reference, a rewrite read at 0.88-0.98x and a template at
    0.98-1.02x are both at par: the plan keeps its own order. A reading surely below par still counts."""
    def read(strategy: str, low: float, high: float) -> StrategyOutcome:
        return StrategyOutcome(task_id="a", similarity=0.8, strategy=strategy, kind="rewrite", evaluations=1, passed=1,
                               best_speedup=low, best_high=high)

    priors = strategy_priors([read("rewrite:cheaper_activations", 0.88, 0.98), read("template:fused_tail", 0.98, 1.02),
                              read("template:rowblock", 0.60, 0.70)])
    assert abs(priors["rewrite:cheaper_activations"].score) < 0.05
    assert priors["template:fused_tail"].score == 0.0
    assert priors["template:rowblock"].score < -0.3  # surely slower: upper end 0.70
    ordered, _ = order_strategies([REWRITE, TAIL, ROWBLOCK], priors)
    assert [s.name for s in ordered] == [REWRITE.name, TAIL.name, ROWBLOCK.name]
