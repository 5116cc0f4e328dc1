"""A unit-stride convolution as a sum over its kernel's taps, so the general rules can fuse it.

Mosaic has no convolution, but it has everything a convolution is made of: the input padded as the
convolution pads it, one shifted window of it per kernel tap, and per tap either a product with that
tap's weights (a depthwise convolution: one filter per channel) or a matmul over the input channels (a
dense one). Written that way the channel and batch axes stay parallel and the spatial axes are read
whole, which is the shape of a causal ``conv1d`` kernel (Mamba's short convolution) as a person writes it.

Strided or dilated-input convolutions would need strided slices, which Mosaic cannot lower on values;
grouped convolutions other than depthwise keep the convolution. Both stay as they are.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from maxkernel.analysis.program import Node, Program, Var
from maxkernel.rewrites.build import splice_traced

NOTE = ("the convolution as a sum over its kernel's taps: the input padded as it pads, one shifted window of it "
        "per tap times that tap's weights (Mosaic has no convolution)")
MAX_TAPS = 16  # one shifted window each: beyond this the windows cost more than the convolution saves


def _form(node: Node) -> str | None:
    """``"depthwise"`` or ``"dense"`` for a convolution the taps can write, else None."""
    p = node.params
    x, w = node.ins
    if not (isinstance(x, Var) and isinstance(w, Var)):
        return None
    dn = p["dimension_numbers"]
    spatial = [int(w.shape[d]) for d in dn.rhs_spec[2:]]
    if any(int(s) != 1 for s in p["window_strides"]) or any(int(d) != 1 for d in p["lhs_dilation"]):
        return None
    if int(p["batch_group_count"]) != 1 or math.prod(spatial) > MAX_TAPS:
        return None
    groups = int(p["feature_group_count"])
    if groups == 1:
        return "dense"
    channels, per_group, out_features = int(x.shape[dn.lhs_spec[1]]), int(w.shape[dn.rhs_spec[1]]), int(w.shape[dn.rhs_spec[0]])
    if groups == channels and per_group == 1 and out_features == channels:
        return "depthwise"
    return None


def _taps(node: Node, form: str) -> Any:
    """The traced function: channels-last input, padded, one window per tap, summed in float32."""
    p = node.params
    dn = p["dimension_numbers"]
    nd = len(dn.lhs_spec) - 2
    padding = [(int(lo), int(hi)) for lo, hi in p["padding"]]
    dilation = [int(d) for d in p["rhs_dilation"]]
    precision, out_dtype = p.get("precision"), np.dtype(p.get("preferred_element_type") or node.out.dtype)
    canonical = [0, nd + 1] + list(range(1, nd + 1))  # (batch, feature, spatial...) in (batch, spatial..., feature)
    order = [0] * (nd + 2)
    for logical, position in enumerate(dn.out_spec):
        order[position] = canonical[logical]

    def conv(x: Any, w: Any) -> Any:
        xt = jnp.transpose(x, (dn.lhs_spec[0], *dn.lhs_spec[2:], dn.lhs_spec[1])).astype(jnp.float32)
        wt = jnp.transpose(w, (*dn.rhs_spec[2:], dn.rhs_spec[1], dn.rhs_spec[0])).astype(jnp.float32)
        xp = jax.lax.pad(xt, jnp.float32(0), [(0, 0, 0)] + [(lo, hi, 0) for lo, hi in padding] + [(0, 0, 0)])
        kernel = wt.shape[:nd]
        out = [xp.shape[1 + i] - (kernel[i] - 1) * dilation[i] for i in range(nd)]
        total = None
        for tap in itertools.product(*(range(k) for k in kernel)):
            start = [0] + [t * d for t, d in zip(tap, dilation)] + [0]
            window = jax.lax.slice(xp, start, [xp.shape[0]] + [s + o for s, o in zip(start[1:-1], out)] + [xp.shape[-1]])
            weights = jax.lax.slice(wt, list(tap) + [0, 0], [t + 1 for t in tap] + list(wt.shape[nd:]))
            weights = weights.reshape(wt.shape[nd:])
            if form == "depthwise":
                term = window * weights.reshape(wt.shape[-1])
            else:
                term = jax.lax.dot_general(window, weights, (((nd + 1,), (0,)), ((), ())), precision=precision,
                                           preferred_element_type=jnp.float32)
            total = term if total is None else total + term
        return jnp.transpose(total, order).astype(out_dtype)

    return conv


def convs_as_taps(program: Program) -> int:
    """Every unit-stride depthwise or dense convolution of at most ``MAX_TAPS`` taps, as its taps."""
    count = 0
    for node in list(program.nodes):
        form = _form(node) if node.prim == "conv_general_dilated" else None
        if form is not None:
            inserted = splice_traced(program, node, _taps(node, form))
            inserted[0].notes = (*inserted[0].notes, NOTE)
            count += 1
    return count
