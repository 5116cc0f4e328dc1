"""How every command writes a speedup: one precision everywhere, so that two outputs compare at a glance."""

from __future__ import annotations

from jaxbench.report import format_speedup


def speedup_text(value: float | None, interval: tuple[float, float] | list[float] | None = None) -> str:
    """``1.37x`` (with its interval where there is one), or ``-`` when there is no speedup."""
    return "-" if value == 0 else format_speedup(value, interval)
