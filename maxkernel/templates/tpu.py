"""The Pallas templates written for TPU targets only (Mosaic TPU kernels with TPU block rules, manual DMAs
from HBM, DMA semaphores). The family-specific paged decode kernel comes first."""

from __future__ import annotations

from maxkernel.templates.base import Template
from maxkernel.templates.paged import PAGED_ATTENTION
from maxkernel.templates.tpu_conv import TPU_CONV
from maxkernel.templates.tpu_decode import TPU_DECODE
from maxkernel.templates.tpu_gemm import TPU_GEMM
from maxkernel.templates.tpu_linear_attention import TPU_LINEAR_ATTENTION
from maxkernel.templates.tpu_mla import TPU_MLA
from maxkernel.templates.tpu_mlp import TPU_MLP
from maxkernel.templates.tpu_recurrence import TPU_RECURRENCE
from maxkernel.templates.tpu_moe import TPU_MOE
from maxkernel.templates.tpu_ragged import TPU_RAGGED_PAGED
from maxkernel.templates.tpu_rows import TPU_ROWS
from maxkernel.templates.tpu_ssd import TPU_SSD

TPU_TEMPLATES: tuple[Template, ...] = (PAGED_ATTENTION, TPU_RAGGED_PAGED, TPU_DECODE, TPU_GEMM, TPU_CONV, TPU_MLP, TPU_MOE,
                                     TPU_ROWS, TPU_LINEAR_ATTENTION, TPU_MLA, TPU_SSD, TPU_RECURRENCE)
