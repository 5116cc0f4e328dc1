"""Graph search in-process: beam keeps invalid nodes out and is reproducible by seed; evolve's islands
and niches; parallel lanes with the LLM brain's catalog through replay; the HTML report of a search."""

from __future__ import annotations

import pytest
import asyncio
import random
from pathlib import Path

from actors.config import ActorConfig
from actors.services import Services
from maxkernel.llm.transcript import Exchange, append_exchange
from maxkernel.messages import Plan
from orchestrators.graph import load_graph, params_key
from orchestrators.report import render
from orchestrators.search import Beam, SearchConfig, run_search
from transcripts import PROFILER_REPLY, fenced, kernel_source, text

GEMM = "41k_Gemm_Add_ReLU"
NORM = "12p_RMSNorm"


def _search(evaluator: object, config: SearchConfig, actor: ActorConfig | None = None, task: str = GEMM):  # type: ignore[no-untyped-def]
    services = Services(actor or ActorConfig(remember=False), evaluator=evaluator)  # type: ignore[arg-type]
    try:
        result = asyncio.run(run_search(task, config, services=services))
        graph = load_graph(services.store, result.search_id)
        plan = next(Plan.model_validate(e.payload) for e in services.store.events() if e.message_type == "Plan")
        return result, graph, plan, render(services.store, result.search_id)
    finally:
        services.store.close()
        services.memory.close()


@pytest.mark.slow
def test_beam_is_seeded_and_keeps_invalid_nodes_out(orch_evaluator: object) -> None:
    config = SearchConfig(algorithm="beam", seed=3, max_evaluations=7, width=1, branching=2, depth=2)
    result, graph, plan, html = _search(orch_evaluator, config)
    assert result.evaluations == len(graph.nodes) <= 7 and result.status == "scored"
    first = [e for e in graph.expansions if e.round == 0]
    assert {e.strategy for e in first} == {s.name for s in plan.strategies}
    assert all(e.parent_id is None for e in first)
    later = [e for e in graph.expansions if e.round > 0]
    assert later, "the beam expanded nothing"
    decider = Beam(config, plan.strategies)
    for exp in later:  # each parent was valid and the best expandable node of its round (width 1)
        parent = graph.node(exp.parent_id)
        assert parent.passed
        before = {params_key(e.strategy, e.params) for e in graph.expansions if e.round < exp.round}
        rivals = [n for n in graph.valid if graph.expansions[n.expansion].round == graph.expansions[parent.expansion].round
                  and decider.moves(n, before)]  # only nodes with a move left may enter the beam
        assert parent.low == max(n.low for n in rivals)  # ranked by the lower end of the interval
        assert exp.strategy == parent.strategy and exp.params != parent.params
    keys = [params_key(e.strategy, e.params) for e in graph.expansions]
    assert len(keys) == len(set(keys))
    # The reference is judged as a candidate exactly when some node was to be confirmed, and the claim is
    # against it.
    to_confirm = [n for n in graph.valid if n.basis == "measured" and n.label != "reference-equivalent"
                  and (n.speedup or 0.0) > 1.0]  # its lower end, or at least its centre, clears 1.0
    assert (graph.baseline is not None) == bool(to_confirm) == (result.baseline_speedup is not None)
    assert len(graph.baseline_runs) in ((1, 3) if to_confirm else (0,))
    if result.claim == "faster":
        assert graph.best() is not None and graph.best().confirmed > 1.0 and graph.best().cleared is not None

    # The same seed and the same graph decide the same expansions again.
    tried = {params_key(e.strategy, e.params) for e in first}
    again = Beam(config, plan.strategies).decide(graph, 1, random.Random(f"{config.seed}:1"), tried)
    assert [(s.parent_id, s.params) for s in again] == [(e.parent_id, e.params) for e in later if e.round == 1]

    # The report: best kernel, its checks, the graph and curves as embedded PNGs, strategy contributions.
    assert html.count("data:image/png;base64,") == 3 and "What each strategy contributed" in html
    assert "def kernel" in html and "checks" in html and result.best_strategy in html


@pytest.mark.slow
def test_evolve_islands_and_niches(orch_evaluator: object) -> None:
    config = SearchConfig(algorithm="evolve", seed=5, max_evaluations=5, islands=2, children=1, migrate_every=1)
    result, graph, _plan, _html = _search(orch_evaluator, config, task=NORM)
    assert result.evaluations == len(graph.nodes) == 5
    assert {e.lane for e in graph.expansions} == {0, 1}
    assert all("|" in n.niche for n in graph.nodes)
    children = [e for e in graph.expansions if e.round > 0]
    assert children and all(graph.node(e.parent_id).passed for e in children)
    keys = [params_key(e.strategy, e.params) for e in graph.expansions]
    assert len(keys) == len(set(keys))


def _transcript(path: Path) -> Path:
    rows = [
        ("planner", text("STRATEGY: tiled-a | accumulator grid\nSTRATEGY: tiled-b | 512-row tiles")),
        ("coder", text(fenced(kernel_source()))),
        ("profiler", text(PROFILER_REPLY)),
        ("tuner", text("No variant is worth trying here.")),
    ]
    for actor, result in rows:
        append_exchange(path, Exchange(actor=actor, model="replay", result=result))
    return path


@pytest.mark.slow
def test_parallel_lanes_with_the_llm_brain_through_replay(tmp_path: Path, orch_evaluator: object) -> None:
    actor = ActorConfig(brain="llm", model="replay", transcript=_transcript(tmp_path / "t.jsonl"), remember=False)
    config = SearchConfig(algorithm="parallel", lanes=2, max_evaluations=4, max_rounds=3)
    result, graph, plan, _html = _search(orch_evaluator, config, actor)
    assert [s.name for s in plan.strategies] == ["tiled-a", "tiled-b"]
    assert sorted((e.lane, e.strategy) for e in graph.expansions) == [(0, "tiled-a"), (1, "tiled-b")]
    assert result.stop_reason == "no expansion left to try" and result.evaluations == 2
    assert all(n.passed and n.produced_by.startswith("coder:llm") for n in graph.nodes)
