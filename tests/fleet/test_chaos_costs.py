"""The chaos benchmark's account of what each kill cost: cut attempts are laid at the daemon kill that cut
them, a worker's in-flight evaluations are timed until another tester took them, a Chroma kill's memory
waits are counted until the next kill."""

from __future__ import annotations

from benchmarks.chaos_costs import Attempt, chroma_costs, daemon_costs, worker_costs


def _event(name: str, **fields: object) -> dict[str, object]:
    return {"event": name, **fields}


def test_a_cut_attempt_goes_to_the_last_daemon_kill_before_the_job_ran_again() -> None:
    kills = [{"at": 4.0, "unix": 104.0, "kind": "daemon"}, {"at": 8.0, "unix": 108.0, "kind": "daemon"}]
    cut = [Attempt("job-a", start=100.0, last=103.0, next_start=104.2),
           Attempt("job-b", start=104.3, last=107.5, next_start=108.1)]
    rows = daemon_costs(cut, kills)
    assert rows[0]["cut"] == [{"job": "job-a", "ran_s": 4.0, "unrecorded_s": 1.0, "resumed_after_s": 0.2}]
    assert rows[1]["cut"] == [{"job": "job-b", "ran_s": 3.7, "unrecorded_s": 0.5, "resumed_after_s": 0.1}]


def test_a_worker_kill_times_each_evaluation_it_had_until_it_is_dispatched_again() -> None:
    kills = [{"at": 4.0, "unix": 104.0, "kind": "worker"}, {"at": 8.0, "unix": 108.0, "kind": "worker"}]
    log = [(100.0, _event("host.dispatched", source="s1")),
           (104.05, _event("host.worker_lost", in_flight=1)),
           (104.06, _event("host.redelivered", source="s1")),
           (106.5, _event("host.dispatched", source="s1")),
           (108.02, _event("host.worker_lost", in_flight=0))]
    rows = worker_costs(log, kills)
    assert rows[0] == {"at": 4.0, "in_flight": 1, "redispatched_after_s": [2.45]}
    assert rows[1] == {"at": 8.0, "in_flight": 0, "redispatched_after_s": []}


def test_a_chroma_kill_counts_the_memory_waits_until_the_next_kill() -> None:
    kills = [{"at": 4.0, "unix": 104.0, "kind": "chroma"}, {"at": 8.0, "unix": 108.0, "kind": "chroma"}]
    log = [(104.5, _event("daemon.memory_waiting")), (105.0, _event("daemon.memory_waiting")),
           (107.0, _event("daemon.job_finished"))]
    rows = chroma_costs(log, kills, phase_end=120.0)
    assert rows == [{"at": 4.0, "memory_waits": 2, "waited_s": 0.75}, {"at": 8.0, "memory_waits": 0, "waited_s": 0.0}]


def test_the_cpu_account_gives_a_descendants_seconds_to_its_kind_and_phase(tmp_path) -> None:
    import subprocess
    import sys
    import time

    from benchmarks.chaos_cpu import CpuSampler, kind_of

    assert kind_of("python -m jaxbench.zygote orchestrators.daemon 5") == "daemon"
    assert kind_of("python -m jaxbench.worker 3 4 8589934592") == "evaluator sandbox"
    assert kind_of("/usr/lib/postgresql/15/bin/postgres -D /tmp/x") == "postgres"
    # A stand-in evaluator sandbox: its command line carries the mark, and it spins for about a second.
    spin = tmp_path / "jaxbench.worker.py"
    spin.write_text("import time\nend = time.process_time() + 1.0\nwhile time.process_time() < end:\n    pass\n")
    sampler = CpuSampler(every_s=0.1).start()
    time.sleep(0.3)
    start = time.time()
    subprocess.run([sys.executable, str(spin)], check=True, timeout=60)
    time.sleep(0.3)
    end = time.time()
    time.sleep(0.3)
    sampler.stop()
    during = sampler.seconds(start, end)
    assert 0.5 <= during.get("evaluator sandbox", 0.0) <= 1.6, during
    assert sampler.seconds(end + 0.05, time.time()).get("evaluator sandbox", 0.0) == 0.0
