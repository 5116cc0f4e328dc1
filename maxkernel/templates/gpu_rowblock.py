"""Row-block kernels for NVIDIA GPUs: the row-block template's fused reference (RMSNorm, LayerNorm, softmax,
matmuls with row epilogues), one program instance per block of rows, lowered through Triton. Triton takes
only power-of-two array sizes, so the template applies where every block it would form has them; the
tuning space adds ``num_warps`` and ``num_stages`` to the block rows."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from maxkernel.templates.base import TemplateSpace
from maxkernel.templates.gpu_base import GPU_STAGES, GPU_WARPS, TRITON_SMEM_PLAN, compiler_params_text, power_of_two
from maxkernel.templates.rowblock import ROWBLOCK, _layout, _row_bytes

if TYPE_CHECKING:
    from jaxbench.task import Task
    from maxkernel.analysis import TaskAnalysis

ROW_BLOCKS = (1, 2, 4, 8, 16, 32, 64)
REGISTER_PLAN = 64 * 1024  # bytes of one block's rows held in registers per instance (4 warps x 32 x 512 B)


def _wrapped(source: str, backend_params: str) -> str:
    """The row-block source with every pallas_call given the GPU backend's compiler parameters."""
    header = ("import functools\n\nfrom jax.experimental.pallas import triton as plt\n\n"
              f"_pallas_call = functools.partial(pl.pallas_call, compiler_params={backend_params})\n")
    anchor = "from jax.experimental import pallas as pl\n"
    return source.replace(anchor, anchor + header, 1).replace("pl.pallas_call(", "_pallas_call(")


class GpuRowBlockTemplate:
    name = "gpu_rowblock"
    description = "the fused reference on power-of-two blocks of rows, one GPU program per block (Triton)"

    def applies(self, task: "Task", analysis: "TaskAnalysis") -> str | None:
        reason = ROWBLOCK.applies(task, analysis)
        if reason is not None:
            return reason
        for size in ("cpu", "full"):
            rows, _ = _layout(task, size)
            per_row, whole = _row_bytes(task, size)
            if not power_of_two(rows) or whole and not power_of_two(whole):
                return "Triton needs power-of-two rows and whole-read inputs"
            if size == "full" and per_row + whole > TRITON_SMEM_PLAN:
                # Every instance loads its rows and the whole-read inputs once: they must fit a block.
                return f"one row and the inputs read whole ({per_row + whole} bytes) exceed a block's shared memory"
        return None

    def space(self, task: "Task", analysis: "TaskAnalysis", target: str) -> TemplateSpace:
        rows, _ = _layout(task, "full")
        per_row, _ = _row_bytes(task, "full")
        blocks = [b for b in ROW_BLOCKS if b <= rows and b * per_row <= REGISTER_PLAN] or [1]
        # Wide rows want more threads keeping loads in flight: a warp per 8 KiB a row moves, 4 to 8 of them.
        warps = min(max(GPU_WARPS), max(min(GPU_WARPS), per_row // 8192))
        return TemplateSpace(defaults={"block_rows": blocks[-1], "num_warps": warps, "num_stages": 2},
                             space={"block_rows": blocks, "num_warps": list(GPU_WARPS), "num_stages": list(GPU_STAGES)})

    def render(self, task: "Task", params: dict[str, Any], sizes: tuple[str, ...]) -> str:
        source = ROWBLOCK.render(task, {"block_rows": params["block_rows"]}, sizes)
        return _wrapped(source, compiler_params_text("triton", int(params["num_warps"]), int(params["num_stages"])))


GPU_ROWBLOCK = GpuRowBlockTemplate()
