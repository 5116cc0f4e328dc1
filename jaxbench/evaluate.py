"""The judge: evaluates a candidate against a task and writes the report.

The judge generates inputs on seeds drawn fresh for every evaluation, computes reference outputs in its
own process, and lets the sandboxed worker see only inputs. Correctness, integrity and timing all use
the one executable the worker compiled for the candidate.
"""

from __future__ import annotations

import math
import os
import random
import secrets
import threading
import time
import traceback
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable

import jax
import numpy as np

from jaxbench import static_checks
from jaxbench.candidate import source_sha
from jaxbench.compare import compare_outputs, tree_leaves
from jaxbench.interpret import InterpretMode, default_mode
from jaxbench.pool import WorkerFailure, WorkerHandle, WorkerPool
from jaxbench.report import CheckResult, EvalReport
from jaxbench.task import SUITE_DIR, Task, TaskError, _draw_value, load_task
from jaxbench.task_check import full_shapes
from jaxbench.timing import round_scale, speedup_interval, stats

SUSPICIOUS_SPEEDUP = 20.0
NOISY_CV = 0.25  # timings spread wider than this get a flag: the interval says how much the figure can move


class EvalSettingError(TaskError):
    """An evaluator setting from the environment that means nothing (a user error: one line)."""


def unseen_by_default() -> bool:
    """``JAXBENCH_UNSEEN_SIZE``: on (the default) checks every candidate at an unseen size unless its config
    says no; 0 turns it off for every evaluator that does not say otherwise."""
    value = os.environ.get("JAXBENCH_UNSEEN_SIZE", "1").strip().lower()
    if value not in ("0", "1", "false", "true", "off", "on"):
        raise EvalSettingError(f"JAXBENCH_UNSEEN_SIZE={value!r}: expected 1 or 0")
    return value in ("1", "true", "on")


# The unseen run is bounded by its grid steps (an interpreted run pays per step): at most this many times
# the steps at the declared size, scaled by how much larger the drawn size is, and never fewer than
# UNSEEN_MIN_STEPS. A candidate whose blocks fall apart at the drawn size (halved until they divide an odd
# extent) is tried again on coarser grids of the free parameters; over the bound on every one, it is
# ``rejected``: it serves that size only at a cost the evaluator will not pay.
UNSEEN_STEP_FACTOR = 4.0
UNSEEN_MIN_STEPS = 64
UNSEEN_GRIDS = (1, 8, 128)  # the task's own grid, then multiples of 8, then of 128

# Timing rounds (harness "alike"): each side makes the same number of calls per round, enough that the
# faster side's round lasts about ROUND_MS (from the warm-up rounds, at most MAX_CALLS), and a round
# counts its fastest call: what disturbs a call (another process, a page-fault storm) only adds time, and
# one call of a 1-5 ms kernel is easily all disturbance.
ROUND_MS = 20.0
MAX_CALLS = 8
HARNESSES = ("alike", "legacy")


@dataclass
class EvalConfig:
    correctness_seeds: int = 3
    timing_rounds: int = 10
    warmup_rounds: int = 2
    timeout_s: float = 120.0
    timing: bool = True
    static_checks: bool = True  # off only to prove that the sandbox alone still holds
    # Also check at a size drawn from the task's free parameters (tasks that declare none skip it): a
    # kernel that serves only the sizes it was rendered for refuses the drawn one and is ``incorrect``
    # with the size named. On unless JAXBENCH_UNSEEN_SIZE=0 (or this field) says otherwise.
    unseen_size: bool = field(default_factory=unseen_by_default)
    # How the two sides are timed: "alike" (several calls per round, see ROUND_MS) or "legacy" (one call per
    # round), kept to compare the two (benchmarks/timing_bias.py). The workers' allocator settings are the
    # pool's (WorkerPool(alike=...)), the same for the reference worker and the candidate's.
    harness: str = "alike"

    def __post_init__(self) -> None:
        if self.harness not in HARNESSES:
            raise EvalSettingError(f"EvalConfig.harness={self.harness!r}: expected one of {', '.join(HARNESSES)}")


def unseen_draws(task: Task, base: str, rng: random.Random) -> list[dict[str, Any]]:
    """Sizes to try for the unseen check, finest grid first: each redraws every free parameter; on a coarser
    grid, a parameter whose base value is below the grid step keeps its first draw."""
    first = task.draw_unseen(base, rng)
    current = task.size(base)
    draws = [first]
    for step in UNSEEN_GRIDS[1:]:
        values = dict(first)
        for name, free in task.spec.free.items():
            coarse = math.lcm(free.multiple_of, step)
            if int(current[name]) >= coarse and (free.max is None or free.max >= coarse):
                values[name] = _draw_value(int(current[name]), free.model_copy(update={"multiple_of": coarse}), rng)
        if values not in draws:
            draws.append(values)
    return draws


def unseen_step_limit(base_steps: int, task: Task, base: str, values: dict[str, Any]) -> int:
    """Grid steps the unseen run may take (see UNSEEN_STEP_FACTOR)."""
    current = task.size(base)
    growth = 1.0
    for name in task.spec.free:
        growth *= max(1.0, int(values[name]) / max(1, int(current[name])))
    return max(UNSEEN_MIN_STEPS, math.ceil(UNSEEN_STEP_FACTOR * base_steps * growth))


@dataclass
class _Reference:
    """Compiled reference for one (task, size): the judge's trusted side."""

    task: Task
    static: dict[str, Any]
    arg_specs: list[dict[str, Any]]
    compiled: Any
    jaxpr: str
    flops: float | None
    bytes: float | None
    size: str

    def inputs(self, seed: int) -> list[np.ndarray]:
        args, _ = self.task.get_inputs(jax.random.key(seed), self.size)
        return [np.asarray(a) for a in args]

    def run(self, inputs: list[np.ndarray]) -> Any:
        out = self.compiled(*[jax.device_put(a) for a in inputs])
        return jax.tree_util.tree_map(np.asarray, jax.block_until_ready(out))


def _compile_reference(task: Task, size: str) -> _Reference:
    """The reference compiled for the abstract inputs of ``size``: compiling needs their shapes, not a draw
    (at a check size that keeps the full hidden width, one draw of the weights costs seconds)."""
    try:  # full_shapes traces the reference too: its failure is the task's as well
        args, static, _ = full_shapes(task, size)
        fn = partial(task.reference, **static)
        closed = jax.make_jaxpr(fn)(*args)
        compiled = jax.jit(fn).lower(*args).compile()
    except Exception as exc:  # a broken reference is the task's fault, not the candidate's
        first = (str(exc).strip().splitlines() or [""])[0]
        names = {frame.name for frame in traceback.extract_tb(exc.__traceback__)}
        part = "get_inputs()" if "get_inputs" in names and task.reference.__name__ not in names else "reference()"
        raise TaskError(f"{task.reference_path}: {part} fails at size {size!r}: {type(exc).__name__}: {first}") from exc
    flops, nbytes = _cost(compiled)
    specs = [{"shape": list(a.shape), "dtype": str(a.dtype)} for a in args]
    return _Reference(task, static, specs, compiled, str(closed.jaxpr), flops, nbytes, size)


def _cost(compiled: Any) -> tuple[float | None, float | None]:
    try:
        cost = compiled.cost_analysis()
    except Exception:
        return None, None
    if isinstance(cost, list):
        cost = cost[0] if cost else {}
    cost = cost or {}
    flops, nbytes = cost.get("flops"), cost.get("bytes accessed")
    return (float(flops) if flops is not None else None, float(nbytes) if nbytes is not None else None)


def shifted(inputs: list[np.ndarray]) -> list[np.ndarray]:
    """The same shapes with another value distribution: float inputs scaled by 1.25 and shifted by a
    tenth of their mean magnitude (positive inputs stay positive)."""
    out = []
    for a in inputs:
        if a.dtype.kind == "f" or a.dtype.name == "bfloat16":
            f = a.astype(np.float32)
            f = f * np.float32(1.25) + np.float32(0.1) * np.float32(np.mean(np.abs(f)))
            a = f.astype(a.dtype)
        out.append(a)
    return out


class Evaluator:
    """Owns a worker pool and the compiled references; thread-safe per call."""

    def __init__(self, pool: WorkerPool | None = None, config: EvalConfig | None = None) -> None:
        self.pool = pool or WorkerPool(1)
        self.config = config or EvalConfig()
        self._refs: dict[tuple[str, str, str], _Reference] = {}
        self._lock = threading.Lock()
        # The reference is timed in a worker of its own, built exactly like the candidate's (same
        # process set-up, same input path, same compile path), so neither side has a home advantage.
        self._ref_worker: WorkerHandle | None = None
        self._ref_worker_holds: tuple[str, str, str] | None = None
        self._timing_lock = threading.Lock()

    def close(self) -> None:
        if self._ref_worker is not None:
            self._ref_worker.close()
            self._ref_worker = None
        self.pool.close()

    def _reference_timer(self, ref: _Reference, deadline: float) -> WorkerHandle:
        """The reference worker, loaded with this task's reference (reloaded only when the task changes)."""
        key = (str(ref.task.path), ref.task.source_digest, ref.size)
        if self._ref_worker is None or not self._ref_worker.alive:
            self._ref_worker = self.pool.start_worker()
            self._ref_worker_holds = None
        if self._ref_worker_holds != key:
            source = ref.task.reference_path.read_text() + "\n\nkernel = reference\n"
            reply = self._ref_worker.request(
                {"op": "load", "source": source, "filename": str(ref.task.reference_path), "static": ref.static,
                 "arg_specs": ref.arg_specs, "interpret": "plain", "cpu_budget_s": 3600, "protected": []},
                _left(deadline),
            )
            if not reply.get("ok"):
                raise TaskError(f"{ref.task.reference_path}: reference cannot be timed: {reply.get('reason', '')}")
            self._ref_worker_holds = key
        return self._ref_worker

    def __enter__(self) -> "Evaluator":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- reference side --------------------------------------------------------------------------

    def reference(self, task: Task, size: str) -> _Reference:
        key = (str(task.path), task.source_digest, size)
        with self._lock:
            if key in self._refs:
                return self._refs[key]
        ref = _compile_reference(task, size)
        with self._lock:
            self._refs[key] = ref
        return ref

    # --- one evaluation --------------------------------------------------------------------------

    def evaluate(
        self,
        task: Task | str | Path,
        candidate_source: str,
        target: str = "cpu",
        size: str = "cpu",
        interpret: InterpretMode | None = None,
        filename: str = "candidate.py",
        progress: Callable[[str], None] | None = None,
        expected_program: str | None = None,
    ) -> EvalReport:
        """``expected_program``: the fingerprint (``jaxbench.fingerprint``) of the program a cost model priced
        at this size; the worker's trace must have it, or the candidate is ``rejected``."""
        started = time.monotonic()
        task = task if isinstance(task, Task) else load_task(task)
        report = EvalReport(task=task.id, target=target, size=size, status="ok", candidate_sha=source_sha(candidate_source))
        note = progress or (lambda _msg: None)
        try:
            self._evaluate(task, candidate_source, report, interpret or default_mode(target), filename, note,
                           expected_program)
        finally:
            report.duration_s = round(time.monotonic() - started, 3)
        return report

    def _evaluate(self, task: Task, source: str, report: EvalReport, interpret: InterpretMode,
                  filename: str, note: Callable[[str], None], expected_program: str | None = None) -> None:
        cfg = self.config
        findings, claims_pallas = static_checks.scan(source)
        if not cfg.static_checks:
            findings = []
        report.checks.append(CheckResult(name="static", passed=not findings, detail="; ".join(map(str, findings))))
        if findings:
            syntax = findings[0].rule == static_checks.SYNTAX_RULE
            return _fail(report, "compile_error" if syntax else "rejected", f"static check: {findings[0]}")

        note("compile")
        ref = self.reference(task, report.size)
        report.ref_flops, report.ref_bytes = ref.flops, ref.bytes
        deadline = time.monotonic() + cfg.timeout_s
        worker = self.pool.acquire()
        recycle = False
        try:
            # The worker compiles the candidate while the judge draws inputs and computes the answers.
            # Until its reply is read the pipe is mid-conversation: any failure here retires the worker.
            recycle = True
            worker.send({**self._load_request(ref, source, filename, interpret),
                         "fingerprint": expected_program is not None})
            judging = time.monotonic()
            seeds = [secrets.randbits(31) for _ in range(cfg.correctness_seeds)]
            sets = [ref.inputs(s) for s in seeds]
            sets.append(shifted(ref.inputs(secrets.randbits(31))))
            expected = [ref.run(s) for s in sets]
            deadline = _judged(deadline, judging)
            loaded = worker.receive(_left(deadline))
            recycle = False
            if not loaded.get("ok"):
                recycle = bool(loaded.get("poisoned"))
                return _fail(report, loaded.get("status", "runtime_error"), loaded.get("reason", ""))
            report.kernel_flops, report.kernel_bytes = loaded.get("flops"), loaded.get("bytes")
            if expected_program is not None:
                same = loaded.get("fingerprint") == expected_program
                report.checks.append(CheckResult(
                    name="checked_is_priced", passed=same,
                    detail="" if same else "the program traced for checking differs from the priced one"))
                if not same:
                    return _fail(report, "rejected", "the program traced for checking differs from the priced one "
                                 "traced at the same size: the candidate traces differently when it is checked")
            is_pallas = "pallas_call" in loaded.get("primitives", [])
            if claims_pallas and not is_pallas:
                report.checks.append(CheckResult(name="pallas_runs", passed=False, detail="imports Pallas but no pallas_call is traced"))
                return _fail(report, "rejected", "claims to be a Pallas kernel but its jaxpr has no pallas_call")
            report.label = "pallas-kernel" if is_pallas else ("reference-equivalent" if loaded.get("jaxpr") == ref.jaxpr else "jax")
            report.checks.append(CheckResult(name="pallas_runs", passed=True, detail=report.label))

            note("correctness")
            ran = worker.request({"op": "run", "inputs": sets + [sets[0]]}, _left(deadline))
            if not ran.get("ok"):
                recycle = bool(ran.get("poisoned"))
                return _fail(report, ran.get("status", "runtime_error"), ran.get("reason", ""))
            if not self._judge_outputs(task, report, expected, list(ran["outputs"]), bool(ran.get("mutated"))):
                if report.status == "incorrect" and loaded.get("tpu_rounded_matmuls"):
                    try:
                        recycle = self._name_tpu_precision(task, ref, source, filename, worker, sets, expected,
                                                           report, deadline)
                    except WorkerFailure:  # the verdict stands unnamed; the worker is mid-conversation
                        recycle = True
                return
            executable = ran.get("executable")
            # XLA's cost analysis counts a loop body once, so FLOPs of looping candidates explain nothing.
            flops_reliable = not ({"while", "scan", "pallas_call"} & set(loaded.get("primitives", [])))

            if self.config.timing:
                note("timing")
                self._time(ref, worker, sets, report, deadline, executable, flops_reliable)
            if report.status == "ok" and cfg.unseen_size and task.spec.statics:
                note("redrawn statics")
                self._check_statics(task, report.size, source, filename, interpret, worker, report, deadline)
            if report.status == "ok" and cfg.unseen_size and task.spec.free:
                note("unseen size")
                self._check_unseen_size(task, report.size, source, filename, interpret, worker, report, deadline,
                                        int(loaded.get("grid_steps") or 0))
        except WorkerFailure as failure:
            recycle = True
            return _fail(report, failure.status, failure.reason)
        finally:
            if recycle and worker.alive:
                worker.kill()
            elif worker.alive:
                try:
                    worker.request({"op": "unload"}, 30)
                except WorkerFailure:
                    pass
            self.pool.release(worker)

    def _load_request(self, ref: _Reference, source: str, filename: str, interpret: InterpretMode) -> dict[str, Any]:
        return {
            "op": "load", "source": source, "filename": filename, "static": ref.static,
            "arg_specs": ref.arg_specs, "interpret": interpret, "cpu_budget_s": self.config.timeout_s * 2,
            "protected": [str(SUITE_DIR), str(ref.task.path)],
        }

    def _name_tpu_precision(self, task: Task, ref: _Reference, source: str, filename: str, worker: WorkerHandle,
                            sets: list[list[np.ndarray]], expected: list[Any], report: EvalReport,
                            deadline: float) -> bool:
        """An incorrect TPU candidate whose matmuls were computed as a TPU computes them (``tpu_numerics``):
        rerun with exact float32 matmuls, and when that passes say so in the reason, so a user sees that the
        candidate is wrong only at the precision it asked the MXU for. The status stays ``incorrect``.
        True when the worker must be retired (the candidate poisoned it)."""
        request = {**self._load_request(ref, source, filename, "tpu"), "exact_matmuls": True}
        loaded = worker.request(request, _left(deadline))
        ran = worker.request({"op": "run", "inputs": sets}, _left(deadline)) if loaded.get("ok") else loaded
        if not ran.get("ok"):
            return bool(ran.get("poisoned"))
        tol = task.spec.tolerance
        if all(compare_outputs(e, a, tol.atol, tol.rtol).ok for e, a in zip(expected, ran["outputs"])):
            report.reason = (f"incorrect under TPU matmul precision (a TPU rounds the operands of float32 matmuls "
                             f"below HIGHEST precision to bfloat16; exact float32 passes): {report.reason}")
        return False

    def _check_unseen_size(self, task: Task, base: str, source: str, filename: str, interpret: InterpretMode,
                           worker: WorkerHandle, report: EvalReport, deadline: float, base_steps: int) -> None:
        """Run the candidate at a size drawn afresh from the task's free parameters, which no tuning saw.

        A kernel that hard-codes the shapes it was traced at fails here, and is ``incorrect`` with the size
        named. The run is bounded by its grid steps (``unseen_step_limit``): a draw over the bound is not
        compiled, and a coarser one is tried. Called last: the worker's executable is replaced by the one
        compiled at the new size.
        """
        refused: list[str] = []
        for values in unseen_draws(task, base, random.Random(secrets.randbits(63))):
            shown = "unseen size " + ", ".join(f"{name}={values[name]}" for name in task.spec.free)
            judging = time.monotonic()
            ref = _compile_reference(task.with_size("unseen", values), "unseen")
            deadline = _judged(deadline, judging)
            request = {**self._load_request(ref, source, filename, interpret),
                       "max_grid_steps": unseen_step_limit(base_steps, task, base, values)}
            try:
                loaded = worker.request(request, _left(deadline))
                if loaded.get("status") == "over_budget":
                    refused.append(f"{shown}: {loaded.get('reason', '')}")
                    continue
                judging = time.monotonic()
                inputs = ref.inputs(secrets.randbits(31))
                expected = ref.run(inputs)
                deadline = _judged(deadline, judging)
                ran = worker.request({"op": "run", "inputs": [inputs]}, _left(deadline)) if loaded.get("ok") else loaded
            except WorkerFailure as failure:
                raise WorkerFailure(failure.status, f"{shown}: {failure.reason}") from failure
            if refused:  # say which finer draws were not run, and why
                shown += f" (drawn again: {'; '.join(refused)})"
            self._judge_unseen(task, report, shown, expected, ran)
            return
        detail = (f"{'; '.join(refused)}, against {base_steps} at size {base!r}: its blocks fall apart at sizes "
                  "it claims to serve")
        report.checks.append(CheckResult(name="correct_unseen_size", passed=False, detail=detail))
        _fail(report, "rejected", detail)

    def _check_statics(self, task: Task, size: str, source: str, filename: str, interpret: InterpretMode,
                       worker: WorkerHandle, report: EvalReport, deadline: float) -> None:
        """Run the candidate with the task's declared numeric statics redrawn in their ranges (``statics`` in
        task.yaml): a kernel that hard-codes the usual value is ``incorrect`` with the values named. Replaces
        the worker's executable, so it runs after timing."""
        judging = time.monotonic()
        _, static, _ = full_shapes(task, size)
        drawn = task.draw_statics(static, random.Random(secrets.randbits(63)))
        shown = "redrawn statics " + ", ".join(f"{name}={value}" for name, value in drawn.items())
        ref = _compile_reference(task.with_statics(drawn), size)
        inputs = ref.inputs(secrets.randbits(31))
        expected = ref.run(inputs)
        deadline = _judged(deadline, judging)
        try:
            loaded = worker.request(self._load_request(ref, source, filename, interpret), _left(deadline))
            ran = worker.request({"op": "run", "inputs": [inputs]}, _left(deadline)) if loaded.get("ok") else loaded
        except WorkerFailure as failure:
            raise WorkerFailure(failure.status, f"{shown}: {failure.reason}") from failure
        self._judge_unseen(task, report, shown, expected, ran, check="correct_redrawn_statics")

    def _judge_unseen(self, task: Task, report: EvalReport, shown: str, expected: Any, ran: dict[str, Any],
                      check: str = "correct_unseen_size") -> None:
        if not ran.get("ok"):
            if ran.get("poisoned"):
                raise WorkerFailure("incorrect", f"{shown}: {ran.get('reason', '')}")
            detail = f"{shown}: {ran.get('status', 'runtime_error')}: {ran.get('reason', '')}"
            report.checks.append(CheckResult(name=check, passed=False, detail=detail))
            return _fail(report, "incorrect", detail)
        tol = task.spec.tolerance
        cmp = compare_outputs(expected, ran["outputs"][0], tol.atol, tol.rtol)
        report.checks.append(CheckResult(name=check, passed=cmp.ok,
                                         detail=f"{shown}: {cmp.reason}" if cmp.reason else shown))
        if not cmp.ok:
            report.max_abs_err = max(report.max_abs_err or 0.0, cmp.max_abs_err)
            _fail(report, "incorrect", f"{shown}: {cmp.reason}")

    def _judge_outputs(self, task: Task, report: EvalReport, expected: list[Any], actual: list[Any], mutated: bool) -> bool:
        tol = task.spec.tolerance
        worst = 0.0
        names = [f"inputs_seed_{i}" for i in range(len(expected) - 1)] + ["inputs_shifted"]
        for name, exp, act in zip(names, expected, actual):
            cmp = compare_outputs(exp, act, tol.atol, tol.rtol)
            report.checks.append(CheckResult(name=f"correct_{name}", passed=cmp.ok, detail=cmp.reason))
            worst = max(worst, cmp.max_abs_err)
            if not cmp.ok:
                report.max_abs_err = cmp.max_abs_err
                reason = f"{name}: {cmp.reason}"
                status = "incorrect"
                if "dtype" in cmp.reason:
                    reason = f"{name}: {cmp.reason} (outputs must keep the task's dtypes)"
                _fail(report, status, reason)
                return False
        report.max_abs_err = worst
        # Input dependence: where the reference's outputs differ, the candidate's must too.
        dependent = all(
            _differs(actual[i], actual[0]) for i in range(1, len(actual) - 1) if _differs(expected[i], expected[0])
        )
        report.checks.append(CheckResult(name="input_dependence", passed=dependent))
        if not dependent:
            _fail(report, "rejected", "outputs do not change when inputs change")
            return False
        # One executable on identical inputs must give bit-identical outputs.
        same = not _differs(actual[0], actual[-1])
        report.checks.append(CheckResult(name="deterministic", passed=same))
        if not same:
            _fail(report, "rejected", "two runs on identical inputs disagree (bit-for-bit)")
            return False
        report.checks.append(CheckResult(name="inputs_unchanged", passed=not mutated))
        if mutated:
            _fail(report, "rejected", "the candidate mutated its inputs")
            return False
        report.correct = True
        return True

    def _time(self, ref: _Reference, worker: WorkerHandle, sets: list[list[np.ndarray]], report: EvalReport,
              deadline: float, executable: Any, flops_reliable: bool) -> None:
        with self._timing_lock:  # one timing at a time: concurrent rounds would disturb each other
            self._time_locked(ref, worker, sets, report, deadline, executable, flops_reliable)

    def _time_locked(self, ref: _Reference, worker: WorkerHandle, sets: list[list[np.ndarray]], report: EvalReport,
                     deadline: float, executable: Any, flops_reliable: bool) -> None:
        cfg = self.config
        timing_sets = sets[: max(1, len(sets) - 1)]
        executables: set[Any] = set()
        try:
            ref_timer = self._reference_timer(ref, deadline)
        except WorkerFailure as failure:
            raise TaskError(f"{ref.task.reference_path}: reference timing worker failed: {failure.reason}") from failure

        def measure(rounds: int, offset: int, calls: int) -> tuple[list[float], list[float]]:
            ref_ms, cand_ms = [], []
            for r in range(rounds):
                inputs = timing_sets[r % len(timing_sets)]
                scale = round_scale(offset + r)
                reference_first = (offset + r) % 2 == 1  # ABBA order: neither side always goes first
                if reference_first:
                    ref_ms.append(_time_reference(ref_timer, inputs, scale, calls, deadline))
                reply = worker.request({"op": "time", "inputs": inputs, "scale": scale, "calls": calls},
                                       _left(deadline))
                if not reply.get("ok"):
                    raise WorkerFailure(reply.get("status", "runtime_error"), reply.get("reason", ""))
                cand_ms.append(_round_ms(reply, calls))
                executables.add(reply.get("executable"))
                if not reference_first:
                    ref_ms.append(_time_reference(ref_timer, inputs, scale, calls, deadline))
            return ref_ms, cand_ms

        cpu_before = _process_cpu_ms()
        warm_ref, warm_cand = measure(cfg.warmup_rounds, 0, 1)
        calls = calls_per_round(warm_ref, warm_cand) if cfg.harness == "alike" else 1
        ref_ms, cand_ms = measure(cfg.timing_rounds, cfg.warmup_rounds, calls)
        same = executables == {executable}
        report.checks.append(CheckResult(name="timed_what_was_checked", passed=same,
                                         detail="" if same else "the timed executable differs from the one checked"))
        if not same:
            raise WorkerFailure("rejected", "the timed executable is not the one whose outputs were checked")
        r, c = stats(ref_ms), stats(cand_ms)
        speedup = r.median_ms / c.median_ms if c.median_ms > 0 else float("inf")
        if speedup > SUSPICIOUS_SPEEDUP:
            ref_ms2, cand_ms2 = measure(cfg.timing_rounds, cfg.warmup_rounds + cfg.timing_rounds, calls)
            r, c = stats(ref_ms + ref_ms2), stats(cand_ms + cand_ms2)
            ref_ms, cand_ms = ref_ms + ref_ms2, cand_ms + cand_ms2
            speedup = r.median_ms / c.median_ms if c.median_ms > 0 else float("inf")
            flop_ratio = (report.ref_flops or 0) / max(report.kernel_flops or 0, 1.0)
            explained = flops_reliable and flop_ratio >= speedup / 4
            detail = (f"speedup {speedup:.1f}x re-measured; reference {report.ref_flops or 0:.3g} FLOPs vs "
                      f"candidate {report.kernel_flops or 0:.3g} FLOPs (XLA cost analysis"
                      f"{'' if flops_reliable else '; loop bodies counted once, so no reduction can be shown'})")
            report.checks.append(CheckResult(name="speedup_plausible", passed=explained, detail=detail))
            if not explained:
                report.flags.append(f"suspicious speedup: {detail}; no algebraic reduction explains it")
        report.judge_cpu_ms = round(_process_cpu_ms() - cpu_before, 1)
        report.timing_calls = calls
        report.ref_ms, report.kernel_ms = round(r.median_ms, 4), round(c.median_ms, 4)
        report.cv, report.ref_cv = round(c.cv, 4), round(r.cv, 4)
        report.speedup = round(speedup, 4)
        low, high = speedup_interval(ref_ms, cand_ms)
        report.speedup_ci = (round(low, 4), round(high, 4))
        if max(c.cv, r.cv) > NOISY_CV:
            report.flags.append(f"noisy timing: cv {c.cv:.2f} (candidate), {r.cv:.2f} (reference); the speedup's "
                                f"95% interval is {low:.2f}–{high:.2f}x")
        report.basis = "measured"


def calls_per_round(ref_ms: list[float], cand_ms: list[float]) -> int:
    """Calls each side makes per round: enough for the faster side's round to last about ``ROUND_MS`` (from
    the warm-up readings, each side's fastest), at most ``MAX_CALLS``. One count for both sides, so neither
    gets more draws at its minimum than the other."""
    fastest = min(min(ref_ms, default=ROUND_MS), min(cand_ms, default=ROUND_MS))
    return max(1, min(MAX_CALLS, math.ceil(ROUND_MS / max(fastest, 1e-3))))


def _round_ms(reply: dict[str, Any], calls: int) -> float:
    """What a round counts: its fastest call (the one call, in one-call rounds)."""
    times = [float(t) for t in reply.get("calls_ms") or [reply["ms"]]]
    if len(times) != calls:
        raise WorkerFailure("rejected", f"asked for {calls} timed calls, got {len(times)}")
    return min(times)


def _process_cpu_ms() -> float:
    """CPU time of this process so far, all its threads (user + system)."""
    t = os.times()
    return (t.user + t.system) * 1e3


def _time_reference(timer: WorkerHandle, inputs: list[np.ndarray], scale: float, calls: int, deadline: float) -> float:
    try:
        reply = timer.request({"op": "time", "inputs": inputs, "scale": scale, "calls": calls}, _left(deadline))
    except WorkerFailure as failure:
        raise TaskError(f"reference timing worker failed: {failure.reason}") from failure
    if not reply.get("ok"):
        raise TaskError(f"reference timing failed: {reply.get('reason', '')}")
    try:
        return _round_ms(reply, calls)
    except WorkerFailure as failure:
        raise TaskError(f"reference timing failed: {failure.reason}") from failure


def _differs(a: Any, b: Any) -> bool:
    return any(not np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(tree_leaves(a), tree_leaves(b)))


def _left(deadline: float) -> float:
    return max(1.0, deadline - time.monotonic())


def _judged(deadline: float, since: float) -> float:
    """``deadline`` moved on by the judge's own time since ``since`` (drawing inputs, compiling and running
    the reference): the timeout bounds the candidate's work, and a check size that keeps large weights makes
    the judge's draws take most of a minute on a loaded machine."""
    return deadline + (time.monotonic() - since)


def _fail(report: EvalReport, status: str, reason: str) -> None:
    report.status = status  # type: ignore[assignment]
    report.reason = reason
    report.correct = False


_default: Evaluator | None = None
_default_lock = threading.Lock()


def default_evaluator() -> Evaluator:
    """A process-wide evaluator with one persistent worker, created on first use."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Evaluator()
        return _default


def evaluate(task: Task | str | Path, candidate_source: str, target: str = "cpu", size: str = "cpu", **kwargs: Any) -> EvalReport:
    """Evaluate one candidate with the process-wide evaluator (see :class:`Evaluator`)."""
    return default_evaluator().evaluate(task, candidate_source, target=target, size=size, **kwargs)
