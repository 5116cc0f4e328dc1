"""Sketches: how the rules brain writes a kernel. A sketch matches a computation by what it computes (its
traced graph), exposes a schedule space, and emits readable Pallas source for one point of it.

``FUSED_GRID`` is the general rules (any computation of known ops with a parallel axis); the expert
sketches for structures the rules cannot derive live in ``maxkernel.templates``.
"""

from __future__ import annotations

from maxkernel.sketches.fused import FUSED_GRID

SKETCHES = (FUSED_GRID,)

__all__ = ["FUSED_GRID", "SKETCHES"]
