"""Comparing a candidate's outputs with the reference's, leaf by leaf."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class Comparison:
    ok: bool
    reason: str
    max_abs_err: float


def tree_leaves(tree: Any) -> list[Any]:
    """Flatten nested tuples/lists/dicts of arrays without importing jax (outputs arrive as numpy)."""
    if isinstance(tree, dict):
        return [leaf for k in sorted(tree) for leaf in tree_leaves(tree[k])]
    if isinstance(tree, (tuple, list)):
        return [leaf for item in tree for leaf in tree_leaves(item)]
    return [tree]


def compare_outputs(expected: Any, actual: Any, atol: float, rtol: float) -> Comparison:
    """Shape, dtype and values within ``atol + rtol * |expected|``; a NaN/Inf the reference lacks fails."""
    exp_leaves, act_leaves = tree_leaves(expected), tree_leaves(actual)
    if len(exp_leaves) != len(act_leaves):
        return Comparison(False, f"expected {len(exp_leaves)} output(s), got {len(act_leaves)}", float("inf"))
    worst = 0.0
    for i, (e, a) in enumerate(zip(exp_leaves, act_leaves)):
        e = np.asarray(e)
        if not hasattr(a, "shape") or not hasattr(a, "dtype"):
            return Comparison(False, f"output {i} is {type(a).__name__}, not an array", float("inf"))
        a = np.asarray(a)
        if a.shape != e.shape:
            return Comparison(False, f"output {i} has shape {a.shape}, expected {e.shape}", float("inf"))
        if a.dtype != e.dtype:
            return Comparison(False, f"output {i} has dtype {a.dtype}, expected {e.dtype}", float("inf"))
        if e.dtype.kind in "biu":
            mismatched = int(np.count_nonzero(a != e))
            if mismatched:
                return Comparison(False, f"output {i}: {mismatched} integer element(s) differ", float("inf"))
            continue
        e64, a64 = e.astype(np.float64), a.astype(np.float64)
        bad_special = (~np.isfinite(a64)) & np.isfinite(e64)
        if bad_special.any():
            return Comparison(False, f"output {i}: {int(bad_special.sum())} NaN/Inf where the reference is finite", float("inf"))
        both_finite = np.isfinite(e64) & np.isfinite(a64)
        same_special = (~np.isfinite(e64)) & ((e64 == a64) | (np.isnan(e64) & np.isnan(a64)))
        if not (both_finite | same_special).all():
            return Comparison(False, f"output {i}: NaN/Inf pattern differs from the reference", float("inf"))
        diff = np.where(both_finite, np.abs(a64 - e64), 0.0)
        err = float(diff.max()) if diff.size else 0.0
        worst = max(worst, err)
        allowed = atol + rtol * np.abs(np.where(both_finite, e64, 0.0))
        over = diff > allowed
        if over.any():
            n = int(over.sum())
            return Comparison(
                False,
                f"output {i}: {n} of {diff.size} element(s) outside tolerance (max abs err {err:.3g}, atol {atol:g}, rtol {rtol:g})",
                err,
            )
    return Comparison(True, "", worst)
