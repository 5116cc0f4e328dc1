"""The GPU Pallas templates, in the order strategies list them (see ``maxkernel.rules.strategy``)."""

from __future__ import annotations

from maxkernel.templates.base import Template
from maxkernel.templates.gpu_attention import GPU_FLASH_ATTENTION
from maxkernel.templates.gpu_gmm import GPU_GROUPED_MATMUL
from maxkernel.templates.gpu_matmul import GPU_MATMUL
from maxkernel.templates.gpu_paged import GPU_PAGED_DECODE
from maxkernel.templates.gpu_rowblock import GPU_ROWBLOCK

GPU_TEMPLATES: tuple[Template, ...] = (GPU_ROWBLOCK, GPU_MATMUL, GPU_FLASH_ATTENTION, GPU_PAGED_DECODE,
                                     GPU_GROUPED_MATMUL)
