"""The rules debugger: source fixes for failures whose cause is known from the report alone."""

from __future__ import annotations

import re

from jaxbench.report import EvalReport
from maxkernel.templates.tpu_gemm import retry_precise, retry_split

_INTERPRET = re.compile(r",\s*interpret\s*=\s*[^,)\n]+")


def fix_known_error(source: str, report: EvalReport) -> str | None:
    """A fixed source, or None when no known fix applies (or the fix changes nothing)."""
    fixed = source
    reason = report.reason
    if "interpret" in source:
        fixed = _INTERPRET.sub("", fixed)  # candidates never choose how Pallas runs
    if "float64" in reason or "f64" in reason:
        fixed = fixed.replace("jnp.float64", "jnp.float32")
    precise = retry_precise(fixed, report)  # a 3-pass TPU GEMM just outside the tolerance
    if precise is not None:
        fixed = precise
    split = retry_split(fixed, report)  # a 1-pass TPU kernel wrong only at the MXU precision it asked for
    if split is not None:
        fixed = split
    return fixed if fixed != source else None
