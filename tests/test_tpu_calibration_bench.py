"""benchmarks/tpu_calibration.py on a small trace this test writes: read as data, every node priced in the
sandbox with its shims named, the statistics and targets computed from the figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from maxkernel.targets.trace_nodes import TraceError, apply_shims, read_trace
from support import load_benchmark

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks" / "tpu_calibration.py"

PROGRAM_HEAD = '''import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

CONFIG = {"rows": 1024, "cols": 512}


def create_inputs(dtype=jnp.float32):
    x = jax.random.normal(jax.random.PRNGKey(0), (CONFIG["rows"], CONFIG["cols"]), dtype=dtype)
    return (x,)
'''

PLAIN = PROGRAM_HEAD + '''

def workload(x):
    return jnp.tanh(x) * 2.0 + 1.0
'''

KERNEL = PROGRAM_HEAD + '''

def _body(x_ref, o_ref):
    o_ref[...] = jnp.tanh(x_ref[...]) * 2.0 + 1.0


def workload(x):
    rows = ROWS
    return pl.pallas_call(
        _body, grid=(x.shape[0] // rows,),
        in_specs=[pl.BlockSpec((rows, x.shape[1]), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((rows, x.shape[1]), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        PARAMS
    )(x)
'''


def _node(code: str, score: float, parent: str) -> str:
    return f"CodeCandidate(parent={parent},\nplan=None,\ncode={code!r},\nscore={score!r},\nstdout='')"


def write_trace(folder: Path, name: str = "tiny") -> Path:
    """A chain of three programs: plain JAX, a Pallas kernel with 8-row blocks (many grid steps), and one
    with 512-row blocks written against the older ``pltpu.TPUCompilerParams`` name."""
    start = _node(PLAIN, 0.05, "None")
    small = _node(KERNEL.replace("ROWS", "8").replace("PARAMS", ""), 0.40, start)
    big = _node(KERNEL.replace("ROWS", "512").replace(
        "PARAMS", "compiler_params=pltpu.TPUCompilerParams(dimension_semantics=('parallel',)),"), 0.04, small)
    path = folder / f"{name}_trace.py"
    path.write_text(big)
    return path


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_benchmark("tpu_calibration")


def test_trace_is_read_start_first_without_running_it(tmp_path: Path) -> None:
    nodes = read_trace(write_trace(tmp_path))
    assert [n.index for n in nodes] == [0, 1, 2]
    assert [n.measured_ms for n in nodes] == [0.05, 0.40, 0.04]
    assert "jnp.tanh(x) * 2.0" in nodes[0].code and "TPUCompilerParams" in nodes[2].code
    marker = tmp_path / "ran"
    evil = f"CodeCandidate(parent=None, code={PLAIN!r}, score=open({str(marker)!r}, 'w').write('x'))"
    (tmp_path / "evil_trace.py").write_text(evil)
    with pytest.raises(TraceError, match="not a literal"):
        read_trace(tmp_path / "evil_trace.py")
    assert not marker.exists()


def test_a_node_without_workload_is_refused(tmp_path: Path) -> None:
    (tmp_path / "bad_trace.py").write_text(_node("CONFIG = {}\ndef create_inputs():\n    return ()\n", 1.0, "None"))
    with pytest.raises(TraceError, match="workload"):
        read_trace(tmp_path / "bad_trace.py")


def test_shims_rename_old_apis_and_say_which() -> None:
    code, applied = apply_shims("p = pltpu.TPUCompilerParams(x)\ny = pltpu.repeat(a, 2, 1)\nz = pltpu.ANY\n")
    assert "pltpu.CompilerParams(x)" in code and "_shim_pltpu_repeat(a, 2, 1)" in code and "pl.ANY" in code
    assert "def _shim_pltpu_repeat" in code
    assert applied == ["pltpu.TPUCompilerParams->CompilerParams", "pltpu.ANY->pl.ANY", "pltpu.repeat->concatenate"]
    assert apply_shims("x = 1\n") == ("x = 1\n", [])


def test_spearman_and_ranks(bench: ModuleType) -> None:
    assert bench.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert bench.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert list(bench.ranks([5.0, 1.0, 5.0])) == [2.5, 1.0, 2.5]
    assert bench.spearman([1, 2], [1, 2]) is None


def test_targets_are_judged_from_the_figures(bench: ModuleType) -> None:
    def node(i: int, measured: float, modelled: float) -> object:
        return bench.NodeResult(trace="t", index=i, measured_ms=measured, modelled_ms=modelled)

    good = [node(i, m, m * 1.1) for i, m in enumerate([1.0, 2.0, 0.5, 0.4, 0.3, 0.2])]
    summary = bench.summarize("t", good)
    assert summary.spearman == pytest.approx(1.0) and summary.fastest_agree
    assert summary.speedup_measured == pytest.approx(5.0) and summary.speedup_modelled == pytest.approx(5.0)
    assert all(t.met for t in bench.judge(good, [summary], None))
    bad = [node(i, m, 1.0 / m) for i, m in enumerate([1.0, 2.0, 0.5, 0.4, 0.3, 0.2])]
    targets = bench.judge(bad, [bench.summarize("t", bad)], (False, "0 of 9"))
    assert not any(t.met for t in targets)


@pytest.mark.slow
def test_benchmark_prices_every_node_of_a_written_trace(tmp_path: Path) -> None:
    traces = tmp_path / "traces"
    traces.mkdir()
    write_trace(traces)
    out = tmp_path / "figures.json"
    proc = subprocess.run([sys.executable, str(BENCH), "--traces", str(traces), "--json", str(out), "--skip-guide"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(out.read_text())["as_configured"]
    nodes = report["nodes"]
    assert [(n["index"], n["measured_ms"]) for n in nodes] == [(0, 0.05), (1, 0.40), (2, 0.04)]
    assert all(n["modelled_ms"] and n["modelled_ms"] > 0 and n["error"] is None for n in nodes), nodes
    assert [n["kind"] for n in nodes] == ["xla", "pallas", "pallas"]
    assert nodes[2]["shims"] == ["pltpu.TPUCompilerParams->CompilerParams"] and nodes[1]["shims"] == []
    # 128 grid steps of 8 rows cost more than 2 steps of 512 rows: the model must rank them as measured
    assert nodes[1]["modelled_ms"] > nodes[2]["modelled_ms"]
    (trace,) = report["traces"]
    assert trace["priced"] == 3 and trace["speedup_measured"] == pytest.approx(0.05 / 0.04)
    assert trace["speedup_modelled"] == pytest.approx(nodes[0]["modelled_ms"] / nodes[2]["modelled_ms"])
    assert {t["name"].split(" ")[0] for t in report["targets"]} >= {"Spearman", "median"}
    assert "targets met:" in proc.stdout


def test_a_folder_without_traces_is_one_line_and_exit_2(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(BENCH), "--traces", str(tmp_path), "--skip-guide"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"error: {tmp_path}: no *_trace.py files"]
