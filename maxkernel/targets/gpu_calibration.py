"""Calibrating the GPU cost model against published figures: Triton's "Fused Attention" tutorial
(triton-lang.org, 06-fused-attention; forward, causal=False, batch 4, 32 heads, head size 64, FP16), whose
TFLOP/s per sequence length are below. The tensor-core ``dot_efficiency`` is fitted at the longest length
(``python -m maxkernel.targets.gpu_calibration`` prints the fit); the other lengths check the model's shape
(waves, launch cost) against the rest of the table.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from maxkernel.targets.gpu_model import _kernel_estimate
from maxkernel.targets.gpu_spec import load_gpu_spec
from maxkernel.targets.jaxpr_walk import find_pallas_calls
from maxkernel.targets.loader import load_candidate
from maxkernel.templates.gpu_attention import render_source
from maxkernel.templates.gpu_base import compiler_params_text

CHIP = "a100"  # assumed: the tutorial page does not name its GPU (see config/targets.yaml)
BATCH, HEADS, HEAD_DIM = 4, 32, 64
# N_CTX -> published TFLOP/s (Triton [FP16], fwd, causal=False).
PUBLISHED_TFLOPS = {1024: 141.414536, 2048: 159.680652, 4096: 160.625979, 8192: 163.402601, 16384: 166.629837}
FIT_AT = 16384


def attention_source() -> str:
    """The tutorial's kernel shape in this project's GPU template: 128-row query blocks, 64-key blocks."""
    return render_source(block_q=128, block_k=64, causal=False, scale=None, out_dtype="float16",
                         backend="triton", compiler=compiler_params_text("triton", 4, 3))


def modelled_tflops(seq: int, dot_efficiency: float | None = None) -> float:
    """The model's TFLOP/s for the tutorial's attention at ``seq`` (flops counted as the tutorial does)."""
    module = load_candidate(attention_source())
    shape = jax.ShapeDtypeStruct((BATCH, HEADS, seq, HEAD_DIM), jnp.float16)
    closed = jax.jit(module.kernel).trace(shape, shape, shape).jaxpr
    (call,) = find_pallas_calls(closed.jaxpr)
    estimate = _kernel_estimate(call, load_gpu_spec(CHIP), [], dot_efficiency)
    flops = 4 * BATCH * HEADS * seq * seq * HEAD_DIM
    return flops / (estimate.time_ms / 1e3) / 1e12


def fitted_dot_efficiency(current: float) -> float:
    """The efficiency at which the model meets the published figure at :data:`FIT_AT`: the modelled time is
    ``a / efficiency + b`` while dots bound it, solved from two evaluations."""
    e1, e2 = current, current / 2
    t1, t2 = 1 / modelled_tflops(FIT_AT, e1), 1 / modelled_tflops(FIT_AT, e2)
    a = (t2 - t1) / (1 / e2 - 1 / e1)
    b = t1 - a / e1
    return a / (1 / PUBLISHED_TFLOPS[FIT_AT] - b)


if __name__ == "__main__":
    from maxkernel.targets.gpu_spec import load_gpu_constants

    now = load_gpu_constants().dot_efficiency.value
    print(f"dot_efficiency fitted at N_CTX={FIT_AT}: {fitted_dot_efficiency(now):.4f} (config: {now})")
    for seq, published in PUBLISHED_TFLOPS.items():
        print(f"N_CTX {seq:6d}: modelled {modelled_tflops(seq):7.1f} TFLOP/s, published {published:7.1f}")
