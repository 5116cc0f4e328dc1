"""Priced = checked: TPU candidates are checked at a size that runs the code priced at ``full``.

The check-size derivation and the twin comparison run here on the test's own candidates (trusted); the
end-to-end tests go through ``evaluate_candidate``, which does them in the sandboxed TPU stage.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from target_kernels import MATMUL_TASK, PLAIN_JAX_RMSNORM, RMSNORM_TASK, matmul_source, rmsnorm_source, write_task

from jaxbench.task import Task, load_task
from maxkernel.evaluation import evaluate_candidate
from maxkernel.targets.check_size import CHECK_MEMORY_BYTES, _doublings, derive_check_size, trace_at
from maxkernel.targets.jaxpr_walk import find_pallas_calls
from maxkernel.targets.loader import load_candidate
from maxkernel.targets.specs import load_tpu_spec
from maxkernel.targets.twins import twin_difference

V5E = load_tpu_spec("v5e")

# Right at cpu size (256 rows), wrong at full (4096): the wrapper scales the weight only past 2048 rows.
XLA_BRANCH = rmsnorm_source(128).replace(
    "    rows, hidden = x.shape\n", "    rows, hidden = x.shape\n    if rows > 2048:\n        w = w * 1.001\n")

# The same shape branch inside the kernel body: a different body is traced at full size.
BODY_BRANCH = rmsnorm_source(128).replace(
    "    o_ref[...] = x * jax.lax.rsqrt(ms + eps) * w_ref[...]\n",
    "    y = x * jax.lax.rsqrt(ms + eps) * w_ref[...]\n"
    "    o_ref[...] = jnp.tanh(y) if ROWS[0] > 2048 else y\n").replace(
    "def kernel(x, w, *, eps):\n    rows, hidden = x.shape\n",
    "ROWS = [0]\n\n\ndef kernel(x, w, *, eps):\n    rows, hidden = x.shape\n    ROWS[0] = rows\n")

# Only a constant changes with the size: the body is the same code with a wrong scale at full size.
CONSTANT_BRANCH = rmsnorm_source(128).replace(
    "* w_ref[...]\n", "* w_ref[...] * SCALE[0]\n").replace(
    "def kernel(x, w, *, eps):\n    rows, hidden = x.shape\n",
    "SCALE = [1.0]\n\n\ndef kernel(x, w, *, eps):\n    rows, hidden = x.shape\n    SCALE[0] = 1.5 if rows > 2048 else 1.0\n")

# Blocks chosen by size: 256-row blocks at full, 128 below; only full runs the priced configuration.
SIZE_CHOSEN_BLOCKS = rmsnorm_source(128).replace(
    "    rows, hidden = x.shape\n", "    rows, hidden = x.shape\n    BR = 256 if rows > 2048 else 128\n")

# y's index map ignores the n grid index: wrong as soon as the n axis has two steps (n=512 at full with
# 256-wide blocks), invisible at cpu size (n=256: one step).
N_OFF_BY_ONE = matmul_source(256, 256, 512).replace("lambda i, j, kk: (kk, j)", "lambda i, j, kk: (kk, 0)")

# The row-wise task at a full size whose arrays need gigabytes (only traced here, never allocated).
HUGE_ROWS_TASK = {
    "task.yaml": RMSNORM_TASK["task.yaml"].replace("id: tgt_rmsnorm", "id: tgt_huge_rows").replace(
        "full: {rows: 4096,", "full: {rows: 1048576,"),
    "reference.py": RMSNORM_TASK["reference.py"],
}

# Blocks of half the rows at every size: the priced configuration exists only at full size.
HALF_BLOCKS = rmsnorm_source(128).replace("BR = 128\n", "").replace(
    "    rows, hidden = x.shape\n", "    rows, hidden = x.shape\n    BR = rows // 2\n")


def _check(source: str, task: Task):  # type: ignore[no-untyped-def]
    return derive_check_size(load_candidate(source), task, V5E)


def test_honest_tiled_matmul_is_checked_with_its_full_blocks_and_two_steps_per_axis(matmul_task: Task) -> None:
    check = _check(matmul_source(256, 256, 512), matmul_task)
    assert check.refusal is None
    # full (1024, 2048, 512) has grid (4, 2, 4); cpu (256, 512, 256) would run one step on every axis.
    assert check.values == {"m": 512, "k": 1024, "n": 512}
    jaxpr = trace_at(load_candidate(matmul_source(256, 256, 512)), matmul_task, check.values, V5E)
    (call,) = find_pallas_calls(jaxpr)
    assert tuple(call.eqn.params["grid_mapping"].grid) == (2, 2, 2) and check.grid_steps == 8


def test_cpu_size_is_used_when_it_keeps_the_block_configuration(rmsnorm_task: Task) -> None:
    check = _check(rmsnorm_source(128), rmsnorm_task)
    assert check.refusal is None and check.values == rmsnorm_task.size("cpu") and check.grid_steps == 2


# k at full is three 512-blocks: its halving (768) runs one k step, and 384 is under the cpu floor (512).
ODD_K_TASK = {
    "task.yaml": MATMUL_TASK["task.yaml"].replace("id: tgt_matmul", "id: tgt_odd_k").replace(
        "full: {m: 1024, k: 2048,", "full: {m: 1024, k: 1536,"),
    "reference.py": MATMUL_TASK["reference.py"],
}


def test_an_extent_with_an_odd_factor_is_checked_at_its_floor_doubled(tmp_path: Path) -> None:
    task = load_task(write_task(tmp_path / "odd_k", ODD_K_TASK))
    check = _check(matmul_source(256, 256, 512), task)
    # 1024 is no halving of 1536 but keeps the 512-blocks and runs two k steps; 512 would run one.
    assert check.refusal is None and check.values == {"m": 512, "k": 1024, "n": 512}
    assert check.grid_steps == 8 and {s.split(":")[0] for s in check.smaller} >= {"k=768", "k=512"}
    assert _doublings(14336, 512, 1, 1792) == [1024, 512]  # 10p's intermediate under its 256-column blocks
    assert _doublings(4096, 512, 1, 4096) == []  # every doubling of the floor is a halving already tried


def test_too_few_steps_at_a_size_are_named(matmul_task: Task) -> None:
    module = load_candidate(matmul_source(256, 256, 512))
    priced = trace_at(module, matmul_task, matmul_task.size("full"), V5E)
    one_row_block = trace_at(module, matmul_task, {"m": 256, "k": 2048, "n": 512}, V5E)
    difference = twin_difference(priced, one_row_block)
    assert difference is not None and "grid axis 0 runs 4 steps at full size but 1" in difference
    cpu = twin_difference(priced, trace_at(module, matmul_task, matmul_task.size("cpu"), V5E))
    assert cpu is not None and "block shape of args[0] is (256, 512) at full size but the whole array" in cpu


def test_a_shape_branch_in_the_xla_code_is_checked_where_it_is_priced(rmsnorm_task: Task) -> None:
    check = _check(XLA_BRANCH, rmsnorm_task)
    assert check.refusal is None and check.values == rmsnorm_task.size("full")
    (why,) = check.smaller
    assert why.startswith("rows=2048: XLA code around the kernels differs") and "mul (candidate line" in why


def test_a_shape_branch_in_the_kernel_body_names_the_kernel_and_equation(rmsnorm_task: Task) -> None:
    check = _check(BODY_BRANCH, rmsnorm_task)
    assert check.values == rmsnorm_task.size("full")
    (why,) = check.smaller
    assert "kernel <lambda> (pallas_call 1): kernel body" in why and "branch on shape" in why


def test_a_constant_that_changes_with_size_is_a_difference(rmsnorm_task: Task) -> None:
    check = _check(CONSTANT_BRANCH, rmsnorm_task)
    assert check.values == rmsnorm_task.size("full")
    assert "constant 1.5 at full size but 1.0 at the check size" in check.smaller[0]


def test_blocks_chosen_by_size_are_checked_at_full_size(rmsnorm_task: Task) -> None:
    check = _check(SIZE_CHOSEN_BLOCKS, rmsnorm_task)
    assert check.refusal is None and check.values == rmsnorm_task.size("full")
    assert "block shape of args[0] is (256, 1024) at full size but (128, 1024)" in check.smaller[0]


def test_a_check_size_too_big_for_memory_is_refused(tmp_path: Path) -> None:
    task = load_task(write_task(tmp_path / "huge", HUGE_ROWS_TASK))
    check = _check(HALF_BLOCKS, task)
    assert check.values == task.size("full") and (check.reference_bytes or 0) > CHECK_MEMORY_BYTES
    assert check.refusal is not None and check.refusal.startswith("priced code has no checked twin small enough")
    assert "GiB of memory (limit 3 GiB) to check" in check.refusal
    assert "rows=524288: kernel <lambda> (pallas_call 1): block shape of args[0] is (524288, 1024)" in check.refusal


# A draw that computes the rows from a table 4096 times larger (as a model region's draw runs its layer up to
# the region): 16 GiB at full, though the reference itself reads only 16 MiB.
DRAWN_FROM_A_TABLE = {**RMSNORM_TASK, "reference.py": RMSNORM_TASK["reference.py"].replace(
    "    x = jax.random.normal(kx, (rows, hidden), jnp.float32)\n",
    "    x = jnp.sum(jax.random.normal(kx, (4096, rows, hidden), jnp.float32), axis=0)\n")}


def test_what_drawing_the_inputs_holds_counts_toward_the_check_sizes_memory(tmp_path: Path) -> None:
    task = load_task(write_task(tmp_path / "drawn", DRAWN_FROM_A_TABLE))
    check = _check(rmsnorm_source(4096), task)  # one block of every row: only the full size runs it
    assert check.values == task.size("full") and (check.reference_bytes or 0) > 16 << 30
    assert check.refusal is not None and "GiB of memory (limit 3 GiB) to check" in check.refusal


# A plain-JAX loop over 256-row chunks: one trip at cpu size (256 rows), sixteen at full size.
CHUNK_LOOP = '''\
import jax
import jax.numpy as jnp


def kernel(x, w, *, eps):
    rows, hidden = x.shape

    def chunk(part):
        return part * jax.lax.rsqrt(jnp.mean(part * part, axis=-1, keepdims=True) + eps) * w

    return jax.lax.map(chunk, x.reshape(rows // 256, 256, hidden)).reshape(rows, hidden)
'''


def test_static_loops_keep_two_trips_at_the_check_size(rmsnorm_task: Task) -> None:
    check = _check(CHUNK_LOOP, rmsnorm_task)
    assert check.refusal is None and check.values == {"rows": 512, "hidden": 1024}
    module = load_candidate(CHUNK_LOOP)
    priced = trace_at(module, rmsnorm_task, rmsnorm_task.size("full"), V5E)
    difference = twin_difference(priced, trace_at(module, rmsnorm_task, rmsnorm_task.size("cpu"), V5E))
    assert difference is not None and "static loop 1 runs 16 times at full size but 1" in difference


# Specialized for the full shape only, as a per-size dispatch is: nothing smaller runs the priced code.
FULL_ONLY = rmsnorm_source(128).replace(
    "    rows, hidden = x.shape\n",
    "    rows, hidden = x.shape\n    if rows != 4096:\n        raise ValueError(f'no specialization for {rows} rows')\n")


def test_a_check_too_slow_for_the_evaluator_is_refused(rmsnorm_task: Task, monkeypatch: pytest.MonkeyPatch) -> None:
    from maxkernel.targets import check_size

    monkeypatch.setattr(check_size, "CHECK_GRID_STEPS", 8)
    monkeypatch.setattr(check_size, "CHECK_FLOPS", 1e6)
    check = _check(FULL_ONLY, rmsnorm_task)
    assert check.values == rmsnorm_task.size("full") and check.refusal is not None
    assert "32 grid steps in TPU interpret mode (limit 8)" in check.refusal and "reference FLOPs" in check.refusal
    assert "rows=2048: it does not trace there (ValueError: no specialization for 2048 rows)" in check.refusal


def test_plain_jax_candidate_is_checked_at_cpu_size(rmsnorm_task: Task) -> None:
    check = _check(PLAIN_JAX_RMSNORM, rmsnorm_task)
    assert check.refusal is None and check.values == rmsnorm_task.size("cpu") and check.grid_steps == 0


# --- end to end: evaluate_candidate, with derivation and twin check in the sandboxed TPU stage ---------------


def test_kernel_wrong_only_at_full_size_is_not_ok(rmsnorm_task: Task, evaluator) -> None:  # type: ignore[no-untyped-def]
    # The shape branch sends the check to full size, where its wrong scaling is seen; the reason says why.
    branchy = evaluate_candidate(rmsnorm_task, XLA_BRANCH, target="tpu-v5e", evaluator=evaluator)
    assert branchy.status == "incorrect" and not branchy.correct and branchy.speedup is None
    assert "checked at check(rows=4096, hidden=1024); smaller sizes differ: rows=2048: XLA code" in branchy.reason


@pytest.mark.slow
def test_off_by_one_that_needs_two_grid_steps_is_caught(matmul_task: Task, evaluator) -> None:  # type: ignore[no-untyped-def]
    # It passes at cpu size in TPU interpret mode (what used to be checked), not at the check size.
    at_cpu = evaluator.evaluate(matmul_task, N_OFF_BY_ONE, target="tpu-v5e", size="cpu")
    assert at_cpu.status == "ok", at_cpu.reason
    report = evaluate_candidate(matmul_task, N_OFF_BY_ONE, target="tpu-v5e", evaluator=evaluator)
    assert report.status == "incorrect" and report.size == "check" and report.speedup is None
    assert "checked at check(m=512, k=1024, n=512)" in next(c.detail for c in report.checks if c.name == "priced_is_checked")


def test_priced_code_only_a_huge_size_runs_is_rejected(tmp_path: Path, evaluator) -> None:  # type: ignore[no-untyped-def]
    huge = load_task(write_task(tmp_path / "huge", HUGE_ROWS_TASK))
    refused = evaluate_candidate(huge, FULL_ONLY.replace("rows != 4096", "rows != 1048576"), target="tpu-v5e",
                                 evaluator=evaluator)
    assert refused.status == "rejected" and "no checked twin small enough" in refused.reason
    assert any(c.name == "priced_is_checked" and not c.passed for c in refused.checks)


@pytest.mark.parametrize("kind", ["pallas", "plain-jax"])
@pytest.mark.slow
def test_honest_candidates_are_checked_and_priced(kind: str, matmul_task: Task, rmsnorm_task: Task, evaluator) -> None:  # type: ignore[no-untyped-def]
    task, source = (matmul_task, matmul_source(256, 256, 512)) if kind == "pallas" else (rmsnorm_task, PLAIN_JAX_RMSNORM)
    report = evaluate_candidate(task, source, target="tpu-v5e", evaluator=evaluator)
    assert report.status == "ok" and report.correct, report.reason
    assert report.basis == "modelled" and report.speedup is not None and report.model is not None
    assert report.size == "check"
    checked = next(c for c in report.checks if c.name == "priced_is_checked")
    assert checked.passed and "checked at check(" in checked.detail
    assert report.label == ("pallas-kernel" if kind == "pallas" else "jax")
