"""Low-precision matmuls computed in f32 on a CPU: same products, a much faster kernel.

A bf16 x bf16 product is exact in f32, and the references accumulate such matmuls in f32 already
(``preferred_element_type=float32``), so widening both operands first changes only the order of the
f32 additions. On a CPU without bf16 arithmetic the f32 matmul kernel is the fast path (XLA's bf16 path
converts as it goes); on TPU or GPU the bf16 path is the fast one, so this rewrite is offered on ``cpu``
only.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from maxkernel.analysis.program import Program, Var
from maxkernel.rewrites.base import Rewrite
from maxkernel.rewrites.build import splice_traced

NARROW = ("bfloat16", "float16")


def _widened(node):  # type: ignore[no-untyped-def]
    dims = node.params["dimension_numbers"]
    out_dtype = node.out.dtype

    def dot(a, b):  # type: ignore[no-untyped-def]
        wide = jax.lax.dot_general(a.astype(jnp.float32), b.astype(jnp.float32), dims,
                                   precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32)
        return wide.astype(out_dtype)

    return dot


def widen_matmuls(program: Program) -> int:
    count = 0
    for node in list(program.nodes):
        if node.prim != "dot_general" or not all(isinstance(op, Var) for op in node.ins):
            continue
        if any(np.dtype(op.dtype).name in NARROW for op in node.ins):
            splice_traced(program, node, _widened(node))
            count += 1
    return count


WIDEN_MATMULS = Rewrite("widen_matmuls", "bf16 matmuls run as f32 matmuls of the same (exact) products",
                        widen_matmuls, targets=("cpu",))
