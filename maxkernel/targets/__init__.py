"""Targets: target names, TPU generation specs, TPU lowering validation and the TPU roofline cost model.

Public API::

    parse_target("tpu-v5e") -> ("tpu", "v5e")
    load_tpu_spec("v5e") -> TpuSpec
    validate_tpu(candidate_source, task, "v5e") -> LoweringResult
    model_candidate(candidate_source, task, "v5e") -> ModelEstimate
    model_reference(task, "v5e") -> ModelEstimate
    load_candidate(candidate_source) -> module

Errors a user can cause are TargetError subclasses with one-line messages: CandidateLoadError, ModelError,
UnboundedLoopError (a while loop whose trip count cannot be bounded from the task's inputs: refused, never
priced once) and VmemBudgetError (a kernel that does not fit in the generation's VMEM; ``validate_tpu``
reports it as ``stage="vmem"`` instead of raising).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

# Exports load lazily, so ``parse_target`` (used when the CLI parses --target) does not import JAX.
_EXPORTS = {
    "GENERATIONS": "names", "TARGETS": "names", "TargetError": "names", "parse_target": "names",
    "TpuSpec": "specs", "load_tpu_spec": "specs", "load_tpu_specs": "specs",
    "CandidateLoadError": "loader", "load_candidate": "loader",
    "LoweringResult": "lowering", "validate_tpu": "lowering",
    "VmemBudgetError": "blocks", "UnboundedLoopError": "ops",
    "KernelEstimate": "model", "ModelError": "model", "ModelEstimate": "model",
    "model_candidate": "model", "model_reference": "model",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"maxkernel.targets.{_EXPORTS[name]}"), name)
