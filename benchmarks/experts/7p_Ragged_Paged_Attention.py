"""Expert baseline for 7p: JAX's Pallas TPU ragged_paged_attention (mixed prefill and decode).

The kernel reads one combined cache with k and v interleaved on the head axis
([pages, page_size, 2 * kv_heads, d], k at even, v at odd heads) and a dynamic sequence count.
"""

import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.ragged_paged_attention import kernel as rpa

# JAX's default block sizes for the kernel when no tuned entry applies: 128 kv pages and 32 queries
# a block, capped at the pages of a sequence and at the token count.
KV_PAGES_PER_BLOCK = 128
QUERIES_PER_BLOCK = 32
# The kernel's default VMEM limit is the compiler's scoped one (16 MiB on v5e), too small for the
# double-buffered kv blocks above; v5e and v6e have 128 MiB, of which the kernel is given half.
VMEM_LIMIT_BYTES = 64 * 1024 * 1024


def kernel(q, k_pages, v_pages, kv_lens, page_indices, cu_q_lens, *, sm_scale, max_q_len):
    num_pages, page_size, kv_heads, head_dim = k_pages.shape
    num_seqs, pages_per_seq = page_indices.shape
    kv = jnp.stack([k_pages, v_pages], axis=3).reshape(num_pages, page_size, 2 * kv_heads, head_dim)
    count = jnp.full((1,), num_seqs, jnp.int32)
    return rpa.ragged_paged_attention(
        q, kv, kv_lens, page_indices, cu_q_lens, count, sm_scale=sm_scale,
        num_kv_pages_per_block=min(KV_PAGES_PER_BLOCK, pages_per_seq),
        num_queries_per_block=min(QUERIES_PER_BLOCK, q.shape[0]), vmem_limit_bytes=VMEM_LIMIT_BYTES)
