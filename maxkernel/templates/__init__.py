"""Parameterized Pallas templates that emit readable candidate files.

Each template declares its tunable parameters and their legal values per target; see ``base.Template``.
"""

from __future__ import annotations

from maxkernel.templates.attention import FLASH_ATTENTION
from maxkernel.templates.base import Template, TemplateSpace, sizes_for
from maxkernel.templates.epilogue import FUSED_TAIL
from maxkernel.templates.gmm import GROUPED_MATMUL
from maxkernel.templates.matmul import MATMUL
from maxkernel.templates.rowblock import ROWBLOCK

TEMPLATES: tuple[Template, ...] = (ROWBLOCK, MATMUL, FLASH_ATTENTION, GROUPED_MATMUL, FUSED_TAIL)

__all__ = ["TEMPLATES", "Template", "TemplateSpace", "sizes_for"]
