"""Attention masks as formulas a kernel can evaluate at any size: the reference's mask, recovered.

A flash kernel needs the mask twice: at trace time (in numpy) to sort every (query block, key block) pair
into empty, whole or partial, which becomes the block schedule the kernel walks, and inside the kernel on
partial blocks only, on the block's token positions. Both read one emitted function,
``_visible(rows, cols, ...)``, written with operators alone so that it runs on numpy and on jax arrays.

A family's formula is accepted only when it reproduces the reference's own mask exactly at every size the
candidate is rendered for, with its parameters bound to the task's static arguments by name, so a kernel
never carries a mask it has not been checked against.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class MaskFormula:
    """One mask: the body of ``_visible`` and the static arguments it reads (empty for causal)."""

    family: str
    params: tuple[str, ...]
    body: str  # lines of the function body, indented by four spaces
    description: str

    def source(self) -> str:
        keywords = f", *, {', '.join(self.params)}" if self.params else ""
        signature = f"def _visible(rows, cols{keywords}):"
        doc = f'    """Which keys (cols) each query (rows) may see: {self.description}."""'
        return "\n".join([signature, doc, self.body]) + "\n"

    def evaluate(self, seq_q: int, seq_k: int, static: dict[str, Any]) -> np.ndarray:
        """The [seq_q, seq_k] mask this formula gives, computed by the very source that is emitted."""
        namespace: dict[str, Any] = {}
        exec(compile(self.source(), "<mask formula>", "exec"), namespace)  # our own generated text
        rows, cols = np.arange(seq_q)[:, None], np.arange(seq_k)[None, :]
        kwargs = {p: static[p] for p in self.params}
        return np.broadcast_to(namespace["_visible"](rows, cols, **kwargs), (seq_q, seq_k))


CAUSAL = MaskFormula("causal", (), "    return cols <= rows", "keys at or before the query's position")


def _local_global(block: str, window: str, first: str) -> MaskFormula:
    body = "\n".join([
        f"    query_block, key_block = rows // {block}, cols // {block}",
        f"    local = (key_block <= query_block) & (key_block > query_block - {window})",
        f"    return (local | (key_block < {first})) & (cols <= rows)",
    ])
    return MaskFormula("local_global", (block, window, first), body,
                       f"a causal window of {window} blocks of {block} keys, plus the first {first} blocks")


def _sliding(window: str) -> MaskFormula:
    return MaskFormula("sliding_window", (window,), f"    return (cols <= rows) & (rows - cols < {window})",
                       f"keys at or before the query and fewer than {window} positions back (a sliding window)")


def _int_statics(static: dict[str, Any]) -> list[str]:
    return [name for name, value in static.items() if isinstance(value, (int, np.integer)) and not isinstance(value, bool)]


def candidates(static: dict[str, Any]) -> list[MaskFormula]:
    """Every formula worth trying for a task with these static arguments (causal first)."""
    found = [CAUSAL]
    names = _int_statics(static)
    found += [_sliding(name) for name in names]
    for block, window, first in itertools.permutations(names, 3):
        found.append(_local_global(block, window, first))
    return found


def recover(masks: list[tuple[np.ndarray, dict[str, Any]]]) -> MaskFormula | None | str:
    """The formula matching the reference's mask at every size given as (mask, static args).

    None when the reference masks nothing; a reason string when no known formula matches.
    """
    if all(bool(mask.all()) for mask, _ in masks):
        return None
    for formula in candidates(masks[0][1]):
        if all(set(formula.params) <= set(static) and
               np.array_equal(formula.evaluate(*mask.shape, static), mask) for mask, static in masks):
            return formula
    return "a mask that is neither causal, nor a sliding causal window, nor a causal window with global blocks"
