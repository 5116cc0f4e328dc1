"""The evaluator's TPU pricing alone, in a one-shot sandboxed process: a measured program priced as a candidate.

Calibration against real measurements prices programs whose correctness was proven where they were measured,
so it needs the model's figure without the lowering check and check-size derivation that gate a new
candidate (:mod:`maxkernel.targets.sandboxed`). The price itself comes from the same call
(:func:`maxkernel.targets.model.model_candidate`) inside the same sandbox.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from maxkernel.targets.sandboxed import run_stage, serve

if TYPE_CHECKING:
    from jaxbench.task import Task


class PriceStageResult(BaseModel):
    model: dict[str, Any] | None = None
    pieces: dict[str, Any] | None = None  # with ``capture``: what the price is made of (calibration_fit)
    model_error: str | None = None
    failure: str | None = None  # the sandboxed process itself failed (timeout, crash, refusal)


def run_price_stage(task_path: Path, source: str, generation: str, timeout_s: float = 300,
                    capture: bool = False) -> PriceStageResult:
    """Model ``source`` as a candidate of the task at ``task_path`` on ``generation`` in a fresh sandbox;
    ``capture``: also return the pieces the price is made of, to refit the model's constants on."""
    request = {"task": str(task_path), "source": source, "generation": generation, "capture": capture}
    return run_stage(PriceStageResult, "maxkernel.targets.price_stage", request, timeout_s, "TPU pricing")


def _price(request: dict[str, Any], task: "Task", result: PriceStageResult) -> None:
    from maxkernel.targets.model import model_candidate
    from maxkernel.targets.names import TargetError

    try:
        if request.get("capture"):
            from maxkernel.targets.calibration_fit import capture_pieces

            estimate, pieces = capture_pieces(lambda: model_candidate(request["source"], task, request["generation"]))
            result.model, result.pieces = estimate.as_report_fields(), pieces.model_dump(mode="json")
        else:
            result.model = model_candidate(request["source"], task, request["generation"]).as_report_fields()
    except TargetError as exc:
        result.model_error = str(exc)


if __name__ == "__main__":
    serve(PriceStageResult, _price)  # type: ignore[arg-type]
