"""Evaluating a candidate for a target: the one entry point every part of MaxKernel uses.

CPU and GPU targets go straight to the JaxBench evaluator. TPU targets, on a machine without a TPU, first
lower the candidate for the chosen generation (``compile_error`` with Mosaic's message if that fails),
then check correctness in TPU interpret mode, and rank by the roofline cost model: the report's times
are then ``modelled``. On a TPU host the evaluator measures and the model's figures ride along.

Priced = checked: correctness on a TPU target runs at the candidate's check size
(:mod:`maxkernel.targets.check_size`), not at ``cpu``: the smallest size at which every priced pallas_call
keeps its ``full`` block shapes and runs at least two steps per multi-step grid axis, with the same kernel
bodies and the same XLA code around them. A candidate whose priced code has no such twin small enough to
check is ``rejected``, not ``incorrect``: nothing wrong was observed, but what would be priced cannot be
run, and a model may only price what ran.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from jaxbench.report import CheckResult

if TYPE_CHECKING:
    from jaxbench.evaluate import Evaluator
    from jaxbench.report import EvalReport
    from jaxbench.task import Task
    from maxkernel.config import Settings


def evaluator_from(settings: "Settings") -> "Evaluator":
    """An evaluator with the settings' worker count, memory limit, seeds, rounds and timeout."""
    from jaxbench.evaluate import EvalConfig, Evaluator
    from jaxbench.pool import WorkerPool

    return Evaluator(
        pool=WorkerPool(settings.eval_workers, memory_bytes=int(settings.eval_memory_gb * (1 << 30))),
        config=EvalConfig(correctness_seeds=settings.eval_correctness_seeds, timing_rounds=settings.eval_timing_rounds,
                          timeout_s=settings.eval_timeout_s))


def evaluate_candidate(
    task: "Task",
    source: str,
    target: str = "cpu",
    size: str = "cpu",
    filename: str = "candidate.py",
    evaluator: "Evaluator | None" = None,
    progress: Callable[[str], None] | None = None,
) -> "EvalReport":
    """Evaluate ``source`` for ``target``; ``size`` is where CPU and GPU targets check and measure (TPU
    targets check at the candidate's own check size, derived from ``full``)."""
    from maxkernel.targets.names import parse_target

    kind, generation = parse_target(target)  # TargetError (one line) for an unknown name
    from jaxbench.evaluate import default_evaluator

    ev = evaluator or default_evaluator()
    if kind == "gpu":
        from maxkernel.targets.names import resolve_gpu

        chip = resolve_gpu(target)  # bare "gpu": this machine's GPU, or one line saying there is none
        return _evaluate_gpu(task, source, f"gpu-{chip}", chip, size, filename, ev, progress)
    if kind != "tpu":
        return ev.evaluate(task, source, target=target, size=size, filename=filename, progress=progress)
    assert generation is not None
    return _evaluate_tpu(task, source, target, generation, size, filename, ev, progress)


def _evaluate_tpu(task: "Task", source: str, target: str, generation: str, size: str, filename: str,
                  ev: "Evaluator", progress: Callable[[str], None] | None) -> "EvalReport":
    import jax

    from maxkernel.targets.model import model_reference
    from maxkernel.targets.sandboxed import run_tpu_stage

    found = _lower_in_sandbox(task, source, target, size, filename, ev, progress, f"TPU {generation}",
                              f"tpu_lowering_{generation}",
                              lambda timeout_s: run_tpu_stage(task.path, source, generation, timeout_s=timeout_s))
    if not isinstance(found, tuple):
        return found
    stage, lowering = found
    lowered = CheckResult(name=f"tpu_lowering_{generation}", passed=True,
                          detail=f"lowers for {generation}; VMEM {lowering.get('vmem_bytes') or 0} of "
                                 f"{lowering.get('vmem_budget_bytes') or 0} bytes")
    on_tpu = jax.default_backend() == "tpu"
    return _check_and_price(task, source, target, filename, ev, progress, stage, lowered, on_tpu,
                            lambda: model_reference(task, generation).as_report_fields())


def _evaluate_gpu(task: "Task", source: str, target: str, chip: str, size: str, filename: str,
                  ev: "Evaluator", progress: Callable[[str], None] | None) -> "EvalReport":
    """As for TPU: lower for the chip in the sandboxed process (``compile_error`` with the backend's message),
    check in interpret mode at the check size, and price with the GPU model; on a GPU host, measure there."""
    import jax

    from maxkernel.targets.gpu_model import model_gpu_reference
    from maxkernel.targets.gpu_sandboxed import run_gpu_stage

    name = f"gpu_lowering_{chip}"
    found = _lower_in_sandbox(task, source, target, size, filename, ev, progress, f"GPU {chip}", name,
                              lambda timeout_s: run_gpu_stage(task.path, source, chip, timeout_s=timeout_s))
    if not isinstance(found, tuple):
        return found
    stage, lowering = found
    lowered = CheckResult(name=name, passed=True,
                          detail=f"lowers for {chip} ({', '.join(lowering.get('backends') or []) or 'no kernels'}); "
                                 f"shared memory {lowering.get('smem_bytes') or 0} of "
                                 f"{lowering.get('smem_budget_bytes') or 0} bytes per block")
    on_gpu = jax.default_backend() == "gpu"
    return _check_and_price(task, source, target, filename, ev, progress, stage, lowered, on_gpu,
                            lambda: model_gpu_reference(task, chip).as_report_fields())


def _lower_in_sandbox(task: "Task", source: str, target: str, size: str, filename: str, ev: "Evaluator",
                      progress: Callable[[str], None] | None, what: str, check: str,
                      run_stage: Callable[[float], Any]) -> "tuple[Any, dict[str, Any]] | EvalReport":
    """The accelerator paths' common start: a candidate the static scan rejects goes to the evaluator (which
    refuses it too; untrusted code the scan rejected is never lowered), the rest is lowered by ``run_stage``
    in its sandboxed process. (stage, lowering) when it lowered, else the report that says why not:
    ``rejected`` for a sandbox refusal or a missing backend plugin, ``compile_error`` for the backend's own."""
    from jaxbench import static_checks

    findings, _ = static_checks.scan(source)
    if findings and ev.config.static_checks:
        return ev.evaluate(task, source, target=target, size=size, filename=filename, progress=progress)
    (progress or (lambda _m: None))(f"lowering for {what}")
    stage = run_stage(ev.config.timeout_s * 2)
    lowering = stage.lowering or {}
    if stage.failure or not lowering.get("ok"):
        reason = stage.failure or lowering.get("reason") or "lowering failed"
        refused = bool(stage.failure and "sandbox" in stage.failure) or lowering.get("stage") == "plugin"
        return _not_lowered(task, source, target, check, "rejected" if refused else "compile_error", reason)
    return stage, lowering


def _not_lowered(task: "Task", source: str, target: str, check: str, status: str, reason: str) -> "EvalReport":
    from jaxbench.candidate import source_sha
    from jaxbench.report import EvalReport

    report = EvalReport(task=task.id, target=target, size="full", status=status, reason=reason,  # type: ignore[arg-type]
                        candidate_sha=source_sha(source))
    report.checks.append(CheckResult(name=check, passed=False, detail=reason))
    return report


def _check_and_price(task: "Task", source: str, target: str, filename: str, ev: "Evaluator",
                     progress: Callable[[str], None] | None, stage: Any, lowered: CheckResult, on_device: bool,
                     reference_model: Callable[[], dict[str, Any]]) -> "EvalReport":
    """Check a lowered candidate at its check size (timed only on the target itself) and attach the model's
    figures; off the target, a correct candidate's times are the modelled ones."""
    from jaxbench.candidate import source_sha
    from jaxbench.report import EvalReport

    note = progress or (lambda _m: None)
    check = stage.check
    if check is None or check.refusal:
        reason = check.refusal if check is not None and check.refusal else "no check size was derived"
        report = EvalReport(task=task.id, target=target, size="full", status="rejected", reason=reason,
                            candidate_sha=source_sha(source))
        report.checks += [lowered, CheckResult(name="priced_is_checked", passed=False, detail=reason)]
        return report

    from jaxbench.evaluate import UNSEEN_STEP_FACTOR
    from maxkernel.targets.check_size import check_timeout_s

    previous_timing, previous_timeout = ev.config.timing, ev.config.timeout_s
    ev.config.timing = on_device  # interpreted semantics on a CPU say nothing about accelerator speed
    if not on_device:  # interpreted memory operations, not grid steps, bound the run (page-by-page DMAs)
        # The unseen size's run may take up to UNSEEN_STEP_FACTOR times the check size's steps.
        unseen_runs = UNSEEN_STEP_FACTOR if ev.config.unseen_size and task.spec.free else 0.0
        ev.config.timeout_s = check_timeout_s(check, int(ev.config.correctness_seeds + 2 + unseen_runs), previous_timeout)
    note(f"checking at {check.name}")
    try:
        report = ev.evaluate(task.with_size(check.name, check.values), source, target=target, size=check.name,
                             filename=filename, progress=progress, expected_program=check.fingerprint)
    finally:
        ev.config.timing, ev.config.timeout_s = previous_timing, previous_timeout
    report.size = "check"  # the values are in the priced_is_checked detail; sizes are short names in the store
    why_this_size = f"; smaller sizes differ: {'; '.join(check.smaller[:2])}" if check.smaller else ""
    report.checks.insert(1, lowered)
    report.checks.insert(2, CheckResult(
        name="priced_is_checked", passed=True,
        detail=f"checked at {check.name}: the full-size kernels, block shapes and XLA code, "
               f"{check.grid_steps} grid steps{why_this_size}"))
    if report.status == "incorrect":
        report.reason += f" (checked at {check.name}{why_this_size})"
    if stage.model is None:
        if stage.model_error and report.correct and not on_device:
            # What the model cannot price is refused: a figure that left it out would be cheaper than the code.
            report.checks.append(CheckResult(name="priced", passed=False, detail=stage.model_error))
            report.status, report.reason, report.correct = "rejected", f"cost model: {stage.model_error}", False
        elif stage.model_error:
            report.flags.append(f"cost model: {stage.model_error}")
        return report
    report.model = {"candidate": stage.model, "reference": reference_model()}
    if report.correct and not on_device:
        ref_ms, kernel_ms = report.model["reference"]["time_ms"], stage.model["time_ms"]
        report.ref_ms, report.kernel_ms = round(ref_ms, 6), round(kernel_ms, 6)
        report.speedup = round(ref_ms / kernel_ms, 4) if kernel_ms > 0 else None
        report.basis = "modelled"
    return report
