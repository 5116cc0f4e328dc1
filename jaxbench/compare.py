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
        work = np.float64 if e.dtype.itemsize > 4 else np.float32
        ew, aw = e.astype(work, copy=False), a.astype(work, copy=False)
        with np.errstate(invalid="ignore", over="ignore"):
            diff = np.abs(aw - ew)
            bad = ~(diff <= atol + rtol * np.abs(ew))  # NaN differences land here too
        if bad.any():
            eb, ab = ew[bad], aw[bad]
            same_special = (eb == ab) | (np.isnan(eb) & np.isnan(ab))
            if (~np.isfinite(ab) & np.isfinite(eb)).any():
                n = int((~np.isfinite(ab) & np.isfinite(eb)).sum())
                return Comparison(False, f"output {i}: {n} NaN/Inf where the reference is finite", float("inf"))
            if (~np.isfinite(eb) & ~same_special).any():
                return Comparison(False, f"output {i}: NaN/Inf pattern differs from the reference", float("inf"))
            over = ~same_special
            if over.any():
                finite = np.isfinite(diff)
                err = float(diff[finite].max()) if finite.any() else float("inf")
                return Comparison(
                    False,
                    f"output {i}: {int(over.sum())} of {diff.size} element(s) outside tolerance (max abs err {err:.3g}, atol {atol:g}, rtol {rtol:g})",
                    err,
                )
        finite = np.isfinite(diff)
        if diff.size:
            worst = max(worst, float(diff.max()) if finite.all() else float(diff[finite].max(initial=0.0)))
    return Comparison(True, "", worst)
