"""Replay transcripts for the actor tests, written from the kernel files beside them.

The replies are what a model would answer; the evaluator that judges the kernels is the real one.
"""

from __future__ import annotations

import json
from pathlib import Path

from autogen_core import FunctionCall
from autogen_core.models import CreateResult, RequestUsage

from maxkernel.llm.transcript import Exchange, append_exchange

KERNELS = Path(__file__).resolve().parent / "kernels"
TASK = "41k_Gemm_Add_ReLU"


def kernel_source(block: tuple[int, int, int] | None = None, broken: bool = False) -> str:
    source = (KERNELS / "gemm_add_relu.py").read_text()
    if block is not None:
        source = source.replace("BM, BN, BK = 256, 512, 1024", "BM, BN, BK = {}, {}, {}".format(*block))
    if broken:  # the classic slip: the TPU memory space taken from `pl` instead of `pltpu`
        source = source.replace("pltpu.VMEM((bm, bn)", "pl.VMEM((bm, bn)")
    return source


def text(content: str, prompt: int = 1200, completion: int = 400) -> CreateResult:
    return CreateResult(finish_reason="stop", content=content, cached=False,
                        usage=RequestUsage(prompt_tokens=prompt, completion_tokens=completion))


def call(name: str, args: dict, call_id: str) -> CreateResult:
    return CreateResult(finish_reason="function_calls", cached=False,
                        content=[FunctionCall(id=call_id, name=name, arguments=json.dumps(args))],
                        usage=RequestUsage(prompt_tokens=900, completion_tokens=30))


def fenced(source: str) -> str:
    return f"```python\n{source}```"


PLANNER_REPLY = (
    "STRATEGY: tiled-matmul-epilogue | grid (M/bm, N/bn, K/bk), K last and arbitrary, f32 VMEM accumulator, "
    "bias + ReLU fused on the last K step\n"
    "NOTES: weight is [N, K]: contract dim 1 of both blocks, no transpose; precision HIGHEST."
)
PROFILER_REPLY = (
    "BOUND: overhead\nInterpreted Pallas on CPU pays per grid step; the 2x2x2 grid is small, so time goes to the\n"
    "matmul itself.\nTRY: larger output tiles (bm=512) to halve the grid\nTRY: a full-K block to drop the accumulator loop"
)


def gemm_session(path: Path) -> Path:
    """plan -> draft with a compile error -> debugger fix -> profile -> two tuning variants."""
    rows = [
        ("planner", text(PLANNER_REPLY)),
        ("coder", call("lookup_api", {"name": "pltpu.VMEM"}, "call_1")),
        ("coder", text("Here is the kernel.\n" + fenced(kernel_source(broken=True)))),
        ("debugger", text("`VMEM` is TPU-specific: it lives in `pltpu`, not `pl`.\n" + fenced(kernel_source()))),
        ("profiler", text(PROFILER_REPLY)),
        ("tuner", text("VARIANT: bm=512 bn=512 bk=1024\n" + fenced(kernel_source((512, 512, 1024)))
                       + "\nVARIANT: bm=512 bn=1024 bk=2048\n" + fenced(kernel_source((512, 1024, 2048))))),
    ]
    for actor, result in rows:
        append_exchange(path, Exchange(actor=actor, model="replay", result=result))
    return path


SOFTMAX_TASK = "50k_Matmul_GELU_Softmax"


def softmax_source(stable: bool = True) -> str:
    source = (KERNELS / "matmul_gelu_softmax.py").read_text()
    if not stable:  # the classic speed-up that overflows: no max subtraction before exp
        source = source.replace("    g = g - jnp.max(g, axis=1, keepdims=True)\n", "")
    return source


def softmax_session(path: Path) -> Path:
    """The coder forgets the max subtraction; only the tester's scaled-up edge case catches it."""
    rows = [
        ("planner", text("STRATEGY: row-block-fused | one grid step per 128 rows, full features, GEMM + GELU + softmax fused")),
        ("coder", text(fenced(softmax_source(stable=False)))),
        ("debugger", text("exp overflows for large activations: subtract the row max first.\n" + fenced(softmax_source()))),
        ("profiler", text("BOUND: compute\nOne fused step per row block.\nTRY: bm=256")),
        ("tuner", text("The kernel is already fused; no variant to try.")),
    ]
    for actor, result in rows:
        append_exchange(path, Exchange(actor=actor, model="replay", result=result))
    return path
