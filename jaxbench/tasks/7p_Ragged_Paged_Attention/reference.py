"""Ragged paged attention: one batch mixing decode and prefill-chunk sequences over a paged KV cache.

Queries of all sequences are packed back to back ([total_q_tokens, num_q_heads, head_dim], cu_q_lens
marks the boundaries); keys and values live in fixed-size pages addressed through a per-sequence page
table. The newest q_len tokens of a sequence are its queries, so query i of a sequence with kv_len L and
q_len Q sees kv positions 0 .. L - Q + i (causal). Grouped-query attention: several query heads share a
kv head.
"""

import jax
import jax.numpy as jnp


def _query_lengths(key, num_seqs, num_decode_seqs, total_q_tokens):
    """Random per-sequence query lengths with a fixed total: decodes (1 token) and prefill chunks, shuffled."""
    num_prefill = num_seqs - num_decode_seqs
    prefill_tokens = total_q_tokens - num_decode_seqs
    assert num_prefill > 0 and num_prefill % 2 == 0 and prefill_tokens % (num_prefill // 2) == 0
    # Prefill chunks come in pairs with a fixed sum, so the total never changes while each chunk varies.
    pair_sum = prefill_tokens // (num_prefill // 2)
    lo = max(1, pair_sum // 8)
    ka, kp = jax.random.split(key)
    first = jax.random.randint(ka, (num_prefill // 2,), lo, pair_sum - lo + 1, dtype=jnp.int32)
    q_lens = jnp.concatenate([jnp.ones((num_decode_seqs,), jnp.int32), first, pair_sum - first])
    q_lens = jax.random.permutation(kp, q_lens)
    return q_lens, pair_sum - lo  # the second value bounds every query length, for any key


def get_inputs(key, *, num_seqs, num_decode_seqs, total_q_tokens, num_q_heads, num_kv_heads, head_dim,
               page_size, pages_per_seq, num_pages):
    assert num_q_heads % num_kv_heads == 0 and num_pages >= num_seqs * pages_per_seq
    kq, kk, kv, klen, kkv, kpage = jax.random.split(key, 6)
    q_lens, max_q_len = _query_lengths(klen, num_seqs, num_decode_seqs, total_q_tokens)
    cu_q_lens = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(q_lens).astype(jnp.int32)])
    max_kv_len = pages_per_seq * page_size
    # kv_len >= max_q_len >= q_len always, so any cu_q_lens works with any kv_lens drawn here.
    kv_lens = jax.random.randint(kkv, (num_seqs,), max_q_len, max_kv_len + 1, dtype=jnp.int32)
    # Each sequence owns pages_per_seq distinct pages scattered over the pool (unused ones hold data too).
    page_indices = jax.random.permutation(kpage, num_pages)[: num_seqs * pages_per_seq]
    page_indices = page_indices.reshape(num_seqs, pages_per_seq).astype(jnp.int32)

    # Query scale 2 gives scores of std 2: attention concentrates on a handful of positions, so the
    # output keeps order-one values instead of averaging down to noise over long contexts.
    q = (2.0 * jax.random.normal(kq, (total_q_tokens, num_q_heads, head_dim), jnp.float32)).astype(jnp.bfloat16)
    cache_shape = (num_pages, page_size, num_kv_heads, head_dim)
    k_pages = jax.random.normal(kk, cache_shape, jnp.float32).astype(jnp.bfloat16)
    v_pages = jax.random.normal(kv, cache_shape, jnp.float32).astype(jnp.bfloat16)
    static = {"sm_scale": 1.0 / head_dim**0.5, "max_q_len": max_q_len}
    return (q, k_pages, v_pages, kv_lens, page_indices, cu_q_lens), static


def reference(q, k_pages, v_pages, kv_lens, page_indices, cu_q_lens, *, sm_scale, max_q_len):
    total_q, num_q_heads, head_dim = q.shape
    _, page_size, num_kv_heads, _ = k_pages.shape
    num_seqs, pages_per_seq = page_indices.shape
    group = num_q_heads // num_kv_heads
    max_kv_len = pages_per_seq * page_size
    # Zero rows after the last token so every sequence can take a window of max_q_len rows.
    q_padded = jnp.concatenate([q, jnp.zeros((max_q_len, num_q_heads, head_dim), q.dtype)], axis=0)

    def one_sequence(s):
        start = cu_q_lens[s]
        q_len = cu_q_lens[s + 1] - start
        kv_len = kv_lens[s]
        qs = jax.lax.dynamic_slice_in_dim(q_padded, start, max_q_len, axis=0)
        qs = qs.reshape(max_q_len, num_kv_heads, group, head_dim)
        pages = page_indices[s]
        ks = k_pages[pages].reshape(max_kv_len, num_kv_heads, head_dim)
        vs = v_pages[pages].reshape(max_kv_len, num_kv_heads, head_dim)
        scores = jnp.einsum("qhgd,khd->hgqk", qs, ks, preferred_element_type=jnp.float32) * sm_scale
        row = jnp.arange(max_q_len, dtype=jnp.int32)[:, None]
        col = jnp.arange(max_kv_len, dtype=jnp.int32)[None, :]
        visible = col <= kv_len - q_len + row  # kv position 0 is always visible since kv_len >= q_len
        scores = jnp.where(visible, scores, -jnp.inf)
        probs = jax.nn.softmax(scores, axis=-1)
        out = jnp.einsum("hgqk,khd->qhgd", probs, vs.astype(jnp.float32))
        return out.reshape(max_q_len, num_q_heads, head_dim)

    per_seq = jax.lax.map(one_sequence, jnp.arange(num_seqs, dtype=jnp.int32))
    # Unpack: token t belongs to the sequence s with cu_q_lens[s] <= t < cu_q_lens[s + 1].
    t = jnp.arange(total_q, dtype=jnp.int32)
    seq_of_t = jnp.searchsorted(cu_q_lens[1:], t, side="right")
    out = per_seq[seq_of_t, t - cu_q_lens[seq_of_t]]
    return out.astype(jnp.bfloat16)
