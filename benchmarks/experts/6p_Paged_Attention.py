"""Expert baseline for 6p: JAX's Pallas TPU paged_attention (decode, GQA, scalar-prefetched pages).

The task's layouts are the kernel's own (q [batch, q_heads, d], pages [kv_heads, pages, page_size, d],
page table and lengths int32); the kernel does not scale scores, so q carries 1/sqrt(d).
"""

import math

from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention

# 64 pages of 16 tokens (1024 tokens) a compute block; the block must divide pages_per_seq.
PAGES_PER_COMPUTE_BLOCK = 64


def kernel(q, k_pages, v_pages, page_table, lengths):
    head_dim = q.shape[-1]
    pages_per_seq = page_table.shape[1]
    block = math.gcd(PAGES_PER_COMPUTE_BLOCK, pages_per_seq)
    scaled = (q * (1.0 / math.sqrt(head_dim))).astype(q.dtype)
    return paged_attention(scaled, k_pages, v_pages, lengths, page_table, pages_per_compute_block=block)
