"""Nothing the rules brain renders runs unbounded in the optimizer's process: full-size programs are only
traced; concrete evaluation (idle-subgraph draws, attention masks) is limited to small results.

7p (ragged paged attention) at ``full`` size broadcasts a scalar into a 7.5 GB score tensor inside a
subgraph that the idle-subgraph rewrite used to evaluate concretely; the blocked-attention rewrite used to
evaluate 15p's decay factor at [16, 4096, 4096] (about 6 GB peak) to find the visible keys.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from jaxbench.task import load_task
from maxkernel.analysis.program import Var, trace_program
from maxkernel.rewrites import apply_rewrites, numeric
from maxkernel.rewrites.numeric import CONCRETE_BYTES, TooLargeToEvaluate, evaluate_nodes, result_bytes

TASK = "7p_Ragged_Paged_Attention"

RENDER_ALL = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))  # a regression fails here instead of swapping
from jaxbench.task import load_task
from maxkernel.analysis import analyze_task
from maxkernel.rules.strategy import propose_strategies, render
names = []
for task_id in sys.argv[1:]:
    task = load_task(task_id)
    for strategy in propose_strategies(task, analyze_task(task, "tpu-v5e"), "tpu-v5e"):
        render(task, strategy)
        names.append(f"{task_id} {strategy.name}")
# VmHWM is this program's own high-water mark; ru_maxrss would also count the forking parent's memory,
# which Linux carries across exec (a large pytest process would fail the bound by itself).
peak = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({"rendered": names, "peak_rss_kib": peak}))
"""


@pytest.mark.slow
def test_rendering_for_tpu_stays_small() -> None:
    done = subprocess.run([sys.executable, "-c", RENDER_ALL, TASK, "15p_RetNet_Retention"], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    reply = json.loads(done.stdout.strip().splitlines()[-1])
    assert {f"{TASK} rewrite:vectorize_maps+idle_subgraphs", "15p_RetNet_Retention rewrite:blocked_attention"} <= set(reply["rendered"])
    assert reply["peak_rss_kib"] < 1_500_000  # several hundred MB; 7p's full-size score tensor alone is 7.5 GB


def test_full_size_rewrites_never_evaluate_large_results(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []
    original = numeric.evaluate_nodes

    def watched(nodes, bound):  # type: ignore[no-untyped-def]
        seen.append(result_bytes(nodes))
        if seen[-1] > CONCRETE_BYTES:
            raise AssertionError(f"asked to evaluate {seen[-1]} bytes concretely")
        return original(nodes, bound)

    monkeypatch.setattr(numeric, "evaluate_nodes", watched)
    program = trace_program(load_task(TASK), "full")
    apply_rewrites(program, ["vectorize_maps", "idle_subgraphs"])
    assert seen and max(seen) * 3 <= CONCRETE_BYTES


def test_evaluate_nodes_refuses_before_allocating() -> None:
    program = apply_rewrites(trace_program(load_task(TASK), "full"), ["vectorize_maps"]).program
    big = next(n for n in program.nodes if n.prim == "broadcast_in_dim" and n.out.size > 1 << 30)
    with pytest.raises(TooLargeToEvaluate, match="MiB"):
        evaluate_nodes([big], {v: np.zeros(v.shape, v.dtype) for v in big.ins if isinstance(v, Var)})
