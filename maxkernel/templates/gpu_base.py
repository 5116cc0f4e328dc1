"""What GPU Pallas templates share: the tuning space's axes (blocks, ``num_warps``, ``num_stages``, backend)
and the compiler-parameter text each backend takes. Blocks are powers of two (Triton requires every array
in a kernel to have a power-of-two size)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

GPU_BLOCKS = (16, 32, 64, 128, 256)
GPU_WARPS = (4, 8)
GPU_STAGES = (2, 3, 4)
BACKENDS = ("triton", "mosaic")
TRITON_SMEM_PLAN = 160 * 1024  # shared memory a template plans per block: below the A100's 163 KB


def gpu_target(target: str) -> bool:
    return target.startswith("gpu")


def gpu_sizes(target: str) -> tuple[str, ...]:
    """Sizes a GPU candidate must run at: it is checked at ``cpu`` and lowered at ``full``."""
    return ("cpu", "full") if gpu_target(target) else ("cpu",)


def power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def compiler_params_text(backend: str, num_warps: int, num_stages: int) -> str:
    """The ``compiler_params=`` argument of an emitted pallas_call for ``backend``."""
    if backend == "triton":
        return f"plt.CompilerParams(num_warps={num_warps}, num_stages={num_stages})"
    if backend == "mosaic":
        return f"plgpu.CompilerParams(max_concurrent_steps={num_stages})"
    raise ValueError(f"unknown GPU backend {backend!r}: expected one of {', '.join(BACKENDS)}")


def backend_import(backend: str) -> str:
    if backend == "triton":
        return "from jax.experimental.pallas import triton as plt"
    return "from jax.experimental.pallas import mosaic_gpu as plgpu"


def triton_backend(params: dict[str, Any], template: str) -> str:
    """The backend a template's parameters ask for, refused where the template has no body for it."""
    from maxkernel.rewrites.emit import EmitError

    backend = str(params.get("backend", "triton"))
    if backend != "triton":
        raise EmitError(f"the GPU {template} template emits Triton bodies only")
    return backend


def refusal(found: Iterable[object]) -> str | None:
    """The first reason (a string) among per-size analyses, or None when every size has a shape."""
    return next((f for f in found if isinstance(f, str)), None)
