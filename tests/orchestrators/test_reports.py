"""Chat and reports: the report shows what was accepted (undo included), the history and undo say what each
step was, a chat refuses another task's session, and the report graph stays readable at 60 nodes."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from maxkernel.config import load_settings
from memory import Store
from memory.errors import RecordNotFoundError
from orchestrators.graph import ROOT, Node


def _chat(task: str, lines: list[str], resume: str | None = None) -> tuple[str, str]:
    from actors.config import ActorConfig
    from orchestrators.hitl import run_chat

    said: list[str] = []
    feed = iter(lines)
    session = asyncio.run(run_chat(task, ActorConfig(), resume=resume, read=lambda _p: next(feed), write=said.append))
    return session, "\n".join(said)


@pytest.mark.slow
def test_the_report_shows_the_kernel_accepted_after_two_undos(fast_env: dict[str, str]) -> None:
    from orchestrators.report import gather, render
    from orchestrators.report_data import session_nodes

    lines = ["plan", "a", "implement 1", "a", "test", "implement 2", "a", "test", "undo", "undo", "accept",
             "history", "quit"]
    session, out = _chat("12p_RMSNorm", lines)
    assert "undone: test of reference" in out and "undone: kernel reference (candidate" in out
    assert "approve: kernel — kernel template:rowblock (candidate" in out  # history says what each step was
    assert "redirect: undo — took back kernel reference" in out
    with Store.open(load_settings().resolved_store_url) as store:
        first, second = [n for n in session_nodes(store, session) if n.produced_by != "auto:confirm"][:2]
        assert (first.strategy, second.strategy) == ("template:rowblock", "reference")
        data = gather(store, session)
        assert data.best_id == first.candidate_id and data.best_why == "accepted in the chat"
        page = render(store, session)
    assert f"<th>candidate</th><td>{first.candidate_id}</td>" in page and session in page
    with pytest.raises(RecordNotFoundError, match="is a session of 12p_RMSNorm, not of 41k_Gemm_Add_ReLU"):
        _chat("41k_Gemm_Add_ReLU", ["quit"], resume=session)
    _, resumed = _chat("12p_RMSNorm", ["undo", "quit"], resume=session)  # the acceptance is undone after a resume
    assert "undone: accept of kernel template:rowblock" in resumed


def _nodes(count: int) -> list[Node]:
    """A root with many children, some with fixes and tuning steps below them."""
    out = []
    for i in range(count):
        parent = ROOT if i < count * 2 // 3 else out[i - count // 2].candidate_id
        edge = "apply" if parent == ROOT else ("fix" if i % 2 else "tune")
        passed = i % 5 != 3
        speed = 0.8 + 0.013 * i
        out.append(Node(candidate_id=f"c{i:03d}", session_id="s", parent_id=parent, edge=edge,
                        strategy=f"template:variant_{i}_with_a_long_name", status="ok" if passed else "incorrect",
                        passed=passed, speedup=speed if passed else None,
                        speedup_ci=(speed - 0.05, speed + 0.04) if passed else None, seq=i))
    return out


def test_the_graph_is_readable_at_sixty_nodes_with_strategy_interval_status_and_the_best_path() -> None:
    from orchestrators import report_graph
    from orchestrators.report import highest_low

    nodes = _nodes(60)
    best = highest_low(nodes)
    assert best is not None and best.parent_id != ROOT  # the best sits below the root: a path of two edges
    fig = report_graph.figure(nodes, best.candidate_id)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    labels = {t.get_gid(): t for t in fig.axes[0].texts if (t.get_gid() or "").startswith("label:")}
    assert len(labels) == 61  # every node and the root has its own label
    boxes = [t.get_window_extent(renderer) for t in labels.values()]
    for a, b in itertools.combinations(boxes, 2):
        assert not a.overlaps(b), "two node labels overprint"
    width, height = fig.canvas.get_width_height()
    for box in boxes:  # and each lies inside the picture
        assert box.x0 >= 0 and box.y0 >= 0 and box.x1 <= width and box.y1 <= height
    text = labels[f"label:{best.candidate_id}"].get_text()
    assert text.startswith(best.strategy) and "–" in text and "· ok" in text and "★ best" in text
    failed = next(n for n in nodes if not n.passed)
    assert labels[f"label:{failed.candidate_id}"].get_text().endswith("· incorrect")
    path = report_graph.best_path(report_graph.build(nodes), best.candidate_id)
    assert path[0] == ROOT and path[-1] == best.candidate_id and len(path) == 3
    thick = [line for line in fig.axes[0].lines if line.get_linewidth() > 2]
    assert len(thick) == len(path) - 1  # exactly the best path is drawn thick


def test_the_best_so_far_curve_follows_the_lower_end_not_a_lucky_reading() -> None:
    from orchestrators.report import best_so_far

    steady = Node(candidate_id="a", session_id="s", parent_id=ROOT, edge="apply s", strategy="s", status="ok", passed=True,
                  speedup=1.3, speedup_ci=(1.25, 1.35), seq=1)
    lucky = Node(candidate_id="b", session_id="s", parent_id=ROOT, edge="apply l", strategy="l", status="ok", passed=True,
                 speedup=1.9, speedup_ci=(0.8, 2.9), seq=2)
    assert best_so_far([steady, lucky]) == [1.25, 1.25]
