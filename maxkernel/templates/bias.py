"""A relative-position score bias, blocked: per head, one tile per block distance instead of [seq, seq].

A bias of the form ``table[h, clip(query - key, 0, buckets - 1)]`` (T5/ALiBi-style buckets, flex
attention's score modification) depends on the query and key positions only through their distance. With
square blocks, the bias of block (i, j) is therefore a function of i - j alone, and every distance at or
beyond the last bucket (or below zero) gives one constant tile. The candidate gathers these few tiles from
the table once per call (an XLA gather of heads x (distances + 2) x block x block values) and the kernel
reads the tile of each step's distance from a blocked input that holds them all: a head's tiles stay in
VMEM for all of its steps, so each is fetched once per (batch, head), not once per step.
"""

from __future__ import annotations

import numpy as np

from maxkernel.analysis.program import Program, Var
from maxkernel.rewrites.numeric import evaluate_nodes

TILES_SOURCE = '''def _bias_tiles(bias_table, block):
    """Per head, the bias tile of every block distance d = i - j from -1 to far, and far.

    Tile d holds table[h, clip(d * block + r - c, 0, buckets - 1)] for row r and column c; every distance
    below -1 or above far gives the same tile as -1 or far, so the kernel clamps the distance.
    """
    buckets = bias_table.shape[-1]
    far = -(-(buckets + block - 2) // block)  # from here on every entry is the last bucket
    d = np.arange(-1, far + 1)[:, None, None]
    r = np.arange(block)[None, :, None]
    c = np.arange(block)[None, None, :]
    bucket = np.clip(d * block + r - c, 0, buckets - 1)
    return bias_table[:, bucket], far
'''


def bias_tile_count(buckets: int, block: int) -> int:
    """How many tiles ``_bias_tiles`` gathers per head: distances -1 to far."""
    return -(-(buckets + block - 2) // block) + 2


def is_relative_bias(program: Program, term: Var, table: Var, seq_q: int, seq_k: int, seed: int = 0) -> bool:
    """Whether ``term`` (broadcastable to [..., heads, seq_q, seq_k]) equals table[h, clip(i - j, 0, n - 1)]
    for a random ``table``: checked on values, not on the reference's spelling."""
    rng = np.random.default_rng(seed)
    if len(table.shape) != 2:
        return False
    values = rng.standard_normal(table.shape).astype(table.dtype)
    found = np.asarray(evaluate_nodes(program.ancestors(term), {table: values})[term], dtype=np.float64)
    if found.ndim < 3:
        return False
    heads = found.reshape(-1, *found.shape[-3:])
    if not (heads == heads[:1]).all() or heads.shape[1] != table.shape[0]:
        return False
    rows, cols = np.arange(seq_q)[:, None], np.arange(seq_k)[None, :]
    bucket = np.clip(rows - cols, 0, table.shape[1] - 1)
    expected = values.astype(np.float64)[:, bucket]
    return bool(np.array_equal(np.broadcast_to(heads[0], expected.shape), expected))
