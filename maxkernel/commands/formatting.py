"""How every command writes a speedup: one precision everywhere, so that two outputs compare at a glance."""

from __future__ import annotations

SPEEDUP_DECIMALS = 2


def speedup_text(value: float | None) -> str:
    """``1.37x``, or ``-`` when there is no measured or modelled speedup."""
    return "-" if value is None or value == 0 else f"{value:.{SPEEDUP_DECIMALS}f}x"
