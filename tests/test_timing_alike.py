"""Both timing workers, the reference's and the candidate's, are set up and timed exactly alike."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from jaxbench.evaluate import MAX_CALLS, ROUND_MS, EvalConfig, EvalSettingError, Evaluator, _round_ms, calls_per_round
from jaxbench.task import load_task
from jaxbench.pool import ALLOCATOR_ENV, CPUS_ENV, WorkerFailure, WorkerHandle, WorkerPool, one_core, worker_env
from jaxbench.worker import pin_to
from support import reference_candidate

RMS = "12p_RMSNorm"


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def test_alike_workers_get_the_fixed_allocator_and_legacy_ones_do_not(monkeypatch):
    for name in ALLOCATOR_ENV:
        monkeypatch.delenv(name, raising=False)
    env = worker_env(alike=True)
    assert {k: env[k] for k in ALLOCATOR_ENV} == ALLOCATOR_ENV
    assert not set(ALLOCATOR_ENV) & set(worker_env(alike=False))
    assert CPUS_ENV not in env


def test_worker_env_names_the_cores_and_never_inherits_a_stale_pin(monkeypatch):
    monkeypatch.setenv(CPUS_ENV, "99")
    assert CPUS_ENV not in worker_env(True, None)
    assert worker_env(True, (3, 1))[CPUS_ENV] == "1,3"


def test_one_core_is_one_this_process_may_run_on():
    (core,) = one_core()
    assert core in os.sched_getaffinity(0)


def test_pin_to_keeps_only_allowed_cores_and_ignores_none():
    before = os.sched_getaffinity(0)
    try:
        (core,) = one_core()
        pin_to(f"{core},{max(before) + 1000}")
        assert os.sched_getaffinity(0) == {core}
        pin_to(f"{max(before) + 1000}")  # none allowed: nothing changes
        assert os.sched_getaffinity(0) == {core}
    finally:
        os.sched_setaffinity(0, before)


def test_calls_per_round_fills_the_faster_sides_round_and_is_capped():
    assert calls_per_round([100.0, 90.0], [80.0]) == 1
    assert calls_per_round([30.0], [ROUND_MS / 4]) == 4  # the faster side decides, for both
    assert calls_per_round([ROUND_MS / 4], [30.0]) == 4
    assert calls_per_round([0.01], [0.02]) == MAX_CALLS
    assert calls_per_round([], []) == 1


def test_a_round_counts_its_fastest_call_and_the_count_must_match():
    assert _round_ms({"ms": 5.0, "calls_ms": [5.0, 3.0, 4.0]}, 3) == 3.0
    assert _round_ms({"ms": 5.0}, 1) == 5.0
    with pytest.raises(WorkerFailure):
        _round_ms({"ms": 5.0, "calls_ms": [5.0]}, 3)


def test_an_unknown_harness_is_one_clear_error():
    with pytest.raises(EvalSettingError, match="harness"):
        EvalConfig(harness="fast")


@pytest.mark.slow
def test_both_timing_workers_run_with_the_same_allocator_and_cores():
    cores = one_core()
    with Evaluator(pool=WorkerPool(1, cpus=cores), config=EvalConfig(timing_rounds=2, warmup_rounds=1)) as ev:
        report = ev.evaluate(RMS, reference_candidate(RMS))
        assert report.status == "ok", report.reason
        assert report.timing_calls is not None and 1 <= report.timing_calls <= MAX_CALLS
        assert report.judge_cpu_ms is not None and report.judge_cpu_ms >= 0
        candidate = ev.pool.acquire()
        try:
            reference = ev._ref_worker
            assert reference is not None and reference.alive
            for pid in (candidate.proc.pid, reference.proc.pid):
                env = environ_of(pid)
                assert {k: env.get(k) for k in ALLOCATOR_ENV} == ALLOCATOR_ENV
                assert os.sched_getaffinity(pid) == set(cores)
        finally:
            ev.pool.release(candidate)


def test_the_worker_times_as_many_calls_as_asked():
    source = reference_candidate(RMS)
    with Evaluator(config=EvalConfig(timing=False, unseen_size=False)) as ev:
        ref = ev.reference(load_task(RMS), "cpu")
        handle = WorkerHandle(ev.pool.memory_bytes)
        try:
            loaded = handle.request(ev._load_request(ref, source, "candidate.py", "plain"), 120)
            assert loaded.get("ok"), loaded
            inputs = ref.inputs(1)
            assert handle.request({"op": "run", "inputs": [inputs]}, 120)["ok"]
            reply = handle.request({"op": "time", "inputs": inputs, "scale": 1.01, "calls": 3}, 120)
            assert reply["ok"] and len(reply["calls_ms"]) == 3 and reply["ms"] == reply["calls_ms"][0]
            assert all(t > 0 for t in reply["calls_ms"])
        finally:
            handle.close()


FAULTS_OF_REPEATED_CALLS = """
import resource
import jax, jax.numpy as jnp
x = jnp.ones((4, 1024, 2048), jnp.float32)  # 32 MiB, like 12p's output: at glibc's largest mmap threshold
f = jax.jit(lambda a: a * 2.0)
faults = []
for _ in range(30):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    jax.block_until_ready(f(x))
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(min(faults[-10:]))  # settled: the heap has grown to what the calls need
"""


def _faults_per_call(env: dict[str, str]) -> int:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", FAULTS_OF_REPEATED_CALLS], env=env, capture_output=True, text=True,
                         timeout=120, check=True)
    return int(out.stdout.strip().splitlines()[-1])


def test_a_repeated_call_reuses_its_buffers_in_a_timing_worker_and_faults_afresh_without_the_setting(monkeypatch):
    """The fixed allocator serves every buffer from one never-trimmed heap, so once it has settled a call
    faults in no fresh pages, whatever the worker ran before (a round counts its fastest call); glibc's
    default maps a 32 MiB buffer afresh on every call (8192 page faults), or not, by the process's history.
    Settling takes some 7-14 calls here (small allocations of the other threads split the freed buffer until
    the heap has room for both), so the last 10 of 30 calls are the ones compared."""
    for name in ALLOCATOR_ENV:
        monkeypatch.delenv(name, raising=False)
    alike = _faults_per_call(worker_env(alike=True))
    default = _faults_per_call(worker_env(alike=False))
    assert alike < 100 < 4000 < default, (alike, default)
