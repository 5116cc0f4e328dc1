"""GPU lowering, check-size derivation and modelling of an untrusted candidate, in a one-shot sandboxed
process (as :mod:`maxkernel.targets.sandboxed` does for TPU): ``python -m maxkernel.targets.gpu_sandboxed``
reads a JSON request on stdin, loads the task, enters the JaxBench sandbox before the candidate's code is
touched, and prints one JSON reply line.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from maxkernel.targets.check_size import CheckSize
from maxkernel.targets.sandboxed import _check_size, run_stage, serve

if TYPE_CHECKING:
    from jaxbench.task import Task

# Tracing reads no chip details for GPU kernels; check sizes are derived under this TPU generation's
# abstract device only because the twin search traces under one.
TRACE_GENERATION = "v5e"


class GpuStageResult(BaseModel):
    lowering: dict[str, Any] | None = None
    check: CheckSize | None = None
    model: dict[str, Any] | None = None
    model_error: str | None = None
    failure: str | None = None


def run_gpu_stage(task_path: Path, source: str, chip: str, timeout_s: float = 300) -> GpuStageResult:
    """Validate lowering for ``chip``, derive the check size and model the candidate in a fresh sandboxed process."""
    request = {"task": str(task_path), "source": source, "chip": chip}
    return run_stage(GpuStageResult, "maxkernel.targets.gpu_sandboxed", request, timeout_s, "GPU lowering")


def _gpu_stage(request: dict[str, Any], task: "Task", result: GpuStageResult) -> None:
    from maxkernel.targets.gpu_lowering import validate_gpu
    from maxkernel.targets.gpu_model import model_gpu_candidate
    from maxkernel.targets.names import TargetError

    lowering = validate_gpu(request["source"], task, request["chip"])
    result.lowering = lowering.model_dump(mode="json")
    priced = None
    if lowering.ok:
        result.check, priced = _check_size(request["source"], task, TRACE_GENERATION)
    if lowering.ok and result.check is not None and result.check.refusal is None:
        try:  # the model prices the very full-size trace whose twin is checked
            result.model = model_gpu_candidate(request["source"], task, request["chip"], program=priced).as_report_fields()
        except TargetError as exc:
            result.model_error = str(exc)


if __name__ == "__main__":
    serve(GpuStageResult, _gpu_stage)  # type: ignore[arg-type]
