"""TPU lowering, check-size derivation and modelling of an untrusted candidate, in a one-shot sandboxed process.

Lowering, finding the size at which the priced code is checked (:mod:`maxkernel.targets.check_size`) and
modelling import and trace the candidate, so they must not run in the caller. This module
runs as ``python -m maxkernel.targets.sandboxed`` with a JSON request on stdin: it loads the task first
(trusted), then enters the JaxBench sandbox (rlimits, no network, audit hook refusing writes, process
creation and reads of task references) before the candidate's code is touched, and prints one JSON
reply line. The process is thrown away afterwards, so nothing the candidate did survives it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from pydantic import BaseModel

from maxkernel.targets.check_size import CheckSize

if TYPE_CHECKING:
    from jax.core import ClosedJaxpr

    from jaxbench.task import Task

SANDBOX_MEMORY_BYTES = 16 << 30
StageT = TypeVar("StageT", bound=BaseModel)


class TpuStageResult(BaseModel):
    lowering: dict[str, Any] | None = None
    check: CheckSize | None = None
    model: dict[str, Any] | None = None
    model_error: str | None = None
    failure: str | None = None  # the sandboxed process itself failed (timeout, crash, refusal)


def run_tpu_stage(task_path: Path, source: str, generation: str, timeout_s: float = 300) -> TpuStageResult:
    """Validate lowering, derive the check size and model the candidate for ``generation`` in a fresh
    sandboxed process."""
    request = {"task": str(task_path), "source": source, "generation": generation}
    return run_stage(TpuStageResult, "maxkernel.targets.sandboxed", request, timeout_s, "TPU lowering")


def run_stage(result_type: type[StageT], module: str, request: dict[str, Any], timeout_s: float,
              label: str) -> StageT:
    """``run_sandboxed`` with its reply parsed as ``result_type`` (a model with a ``failure`` field, which
    says why when the process failed or its reply does not parse)."""
    reply, failure = run_sandboxed(module, request, timeout_s, label)
    if failure is not None:
        return result_type(failure=failure)
    try:
        return result_type.model_validate_json(reply or "")
    except ValueError as exc:
        return result_type(failure=f"{label} process sent a malformed reply: {exc}")


def run_sandboxed(module: str, request: dict[str, Any], timeout_s: float, label: str) -> tuple[str | None, str | None]:
    """Run ``python -m module`` with the JSON ``request`` on stdin; (its last JSON line, None) or (None, why not)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONDONTWRITEBYTECODE="1")
    try:
        proc = subprocess.run(
            [sys.executable, "-m", module], input=json.dumps(request), capture_output=True,
            text=True, timeout=timeout_s, env=env, start_new_session=True, cwd="/",
        )
    except subprocess.TimeoutExpired:
        return None, f"{label} did not finish within {timeout_s:.0f} s"
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"{label} process failed (exit {proc.returncode}): {tail}"
    return lines[-1], None


def serve(result_type: type[BaseModel], stage: Callable[[dict[str, Any], "Task", BaseModel], None]) -> None:
    """The sandboxed side: read the request, load the task (trusted), close the sandbox, let ``stage`` fill a
    ``result_type`` (which has a ``failure`` field), and print it as one JSON line."""
    request = json.loads(sys.stdin.read())
    from jaxbench import sandbox
    from jaxbench.task import SUITE_DIR, load_task

    task = load_task(request["task"])
    _ = task.module  # the reference is imported before the sandbox closes its file
    sandbox.enter(SANDBOX_MEMORY_BYTES)
    workdir = Path(tempfile.mkdtemp(prefix="mk_stage_"))
    os.chdir(workdir)
    sandbox.arm(workdir, [SUITE_DIR, task.path])
    result = result_type()
    try:
        stage(request, task, result)
    except sandbox.SandboxViolation as exc:
        result.failure = str(exc)  # type: ignore[attr-defined]
    violations = sandbox.disarm()
    if violations:
        result.failure = f"sandbox: {violations[0]} is not allowed"  # type: ignore[attr-defined]
    sys.stdout.write(result.model_dump_json() + "\n")
    sys.stdout.flush()


def _tpu_stage(request: dict[str, Any], task: "Task", result: TpuStageResult) -> None:
    from maxkernel.targets.lowering import validate_tpu
    from maxkernel.targets.model import model_candidate
    from maxkernel.targets.names import TargetError

    lowering = validate_tpu(request["source"], task, request["generation"])
    result.lowering = lowering.model_dump(mode="json")
    priced = None
    if lowering.ok:
        result.check, priced = _check_size(request["source"], task, request["generation"], interpreted=True)
    if lowering.ok and result.check is not None and result.check.refusal is None:
        try:  # the model prices the very full-size trace whose twin is checked
            result.model = model_candidate(request["source"], task, request["generation"],
                                           program=priced).as_report_fields()
        except TargetError as exc:
            result.model_error = str(exc)


def _check_size(source: str, task: "Task", generation: str,
                interpreted: bool = False) -> tuple[CheckSize, "ClosedJaxpr | None"]:
    """The candidate's check size (``interpreted`` when the check runs in TPU interpret mode) and its
    ``full`` trace, the program to price; the candidate is loaded and traced at each size once."""
    from maxkernel.targets.check_size import derive_check_size, trace_closed_at
    from maxkernel.targets.loader import load_candidate
    from maxkernel.targets.specs import load_tpu_spec

    spec = load_tpu_spec(generation)
    try:
        module = load_candidate(source)
        priced = trace_closed_at(module, task, task.size("full"), spec)
        return derive_check_size(module, task, spec, interpreted, priced_program=priced), priced
    except Exception as exc:  # the candidate lowered at full size, so this is its own doing at another size
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return CheckSize(name="check", values={}, grid_steps=0,
                         refusal=f"no check size could be derived: {type(exc).__name__}: {first}"), None


if __name__ == "__main__":
    serve(TpuStageResult, _tpu_stage)  # type: ignore[arg-type]
