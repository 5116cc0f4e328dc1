"""Reliability: a search killed with SIGKILL at random points, resumed each time, keeps every candidate
evaluated before each kill exactly once, and judges none twice."""

from __future__ import annotations

import pytest
import collections
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from maxkernel.config import load_settings
from memory import Store
from actors.policy import BASELINE, CONFIRM
from orchestrators.graph import load_graph, params_key

TASK = "21k_Gemm_Divide_Sum_Scaling"  # a task with a clear winner, so the top nodes are confirmed
ROOT = Path(__file__).resolve().parents[2]
EVALUATIONS = ("EvalReport", "FixRequest")


def _evaluated(store: Store, confirmations: bool = False, produced_by: str = CONFIRM) -> list[str]:
    """Candidates judged, one entry per judgement: the search's own, or (``confirmations``) its deliberate
    re-measurements of the top nodes at the end (``produced_by=BASELINE``: its runs of the reference)."""
    return [e.candidate_id for e in store.events() if e.message_type in EVALUATIONS
            and ((e.payload["draft"]["produced_by"] == produced_by) if confirmations
                 else e.payload["draft"]["produced_by"] not in (CONFIRM, BASELINE))]


def _evaluated_but_open(store: Store, search_id: str) -> int:
    """Expansions a kill left open although their session already holds an evaluation."""
    graph = load_graph(store, search_id)
    evaluated = {n.expansion for n in graph.nodes}
    return sum(1 for e in graph.expansions if e.status != "done" and e.n in evaluated)


def _start(search_id: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "orchestrators.search", TASK, "--algo", "evolve", "--seed", "7",
                             "--evals", "10", "--search-id", search_id], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow
def test_search_survives_repeated_kill_9(fast_env: dict[str, str]) -> None:
    settings = load_settings()
    search_id = "kill9search"
    rng = random.Random(11)
    snapshots: list[set[str]] = []
    half_done: list[int] = []
    store = Store.open(settings.resolved_store_url)
    try:
        for kill in range(3):  # two kills right after a recorded evaluation, one anywhere
            before = len(_evaluated(store))
            proc = _start(search_id)
            deadline = time.monotonic() + 150
            while len(_evaluated(store)) <= before and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.005)
            # Even kills land right after an evaluation was recorded (its expansion not yet closed), odd ones
            # anywhere in the next draft, evaluation or bookkeeping.
            time.sleep(0.0 if kill % 2 == 0 else rng.uniform(0.0, 2.5))
            assert proc.poll() is None, f"the search ended before it could be killed: {proc.stdout.read()}"
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            snapshots.append(set(_evaluated(store)))
            half_done.append(_evaluated_but_open(store, search_id))
        assert len(snapshots[-1]) > len(snapshots[0]) > 0
        assert any(half_done), "no kill left an expansion with a recorded evaluation open: the resume path went untested"

        final = _start(search_id)
        out, _ = final.communicate(timeout=300)
        assert final.returncode == 0, out
        graph = load_graph(store, search_id)
    finally:
        store.close()

    counts = collections.Counter(n.candidate_id for n in graph.nodes)
    for snapshot in snapshots:
        for candidate_id in snapshot:
            assert counts[candidate_id] == 1, candidate_id
    assert all(c == 1 for c in counts.values())
    # Nothing was judged twice: one evaluation per candidate, one first draft per strategy and parameters.
    again = Store.open(settings.resolved_store_url)
    evaluated = collections.Counter(_evaluated(again))
    assert set(evaluated) == set(counts) and max(evaluated.values()) == 1
    # The top nodes were measured again, at most twice each, and the search names its best by that.
    confirmed = collections.Counter(_evaluated(again, confirmations=True))
    assert confirmed and set(confirmed) <= set(counts) and max(confirmed.values()) <= 2
    assert graph.best() is not None and graph.best().confirmed is not None
    # They were measured against the reference run as a candidate, judged once (three times when suspect).
    assert len(_evaluated(again, confirmations=True, produced_by=BASELINE)) in (1, 3)
    assert graph.baseline is not None and graph.best().cleared is not None
    drafts = collections.Counter(params_key(n.strategy, n.params) for n in graph.nodes if n.edge != "fix")
    assert max(drafts.values()) == 1, drafts
    assert len(graph.nodes) >= 10 or '"no expansion left' in out
    assert graph.status == "done" and all(e.status == "done" for e in graph.expansions)
    assert {e.lane for e in graph.expansions} <= {0, 1}
