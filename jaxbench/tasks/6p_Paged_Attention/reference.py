"""Single-token decode attention over a paged KV cache (GQA), with per-sequence lengths."""

import math

import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, q_heads, kv_heads, head_dim, page_size, pages_per_seq, total_pages, min_len):
    kq, kk, kv, kp, kl = jax.random.split(key, 5)
    q = (1.5 * jax.random.normal(kq, (batch, q_heads, head_dim), jnp.float32)).astype(jnp.bfloat16)
    page_shape = (kv_heads, total_pages, page_size, head_dim)
    k_pages = (1.5 * jax.random.normal(kk, page_shape, jnp.float32)).astype(jnp.bfloat16)
    v_pages = jax.random.normal(kv, page_shape, jnp.float32).astype(jnp.bfloat16)
    # Distinct physical pages for every (sequence, logical page): a prefix of a random permutation.
    perm = jax.random.permutation(kp, total_pages)[: batch * pages_per_seq]
    page_table = perm.reshape(batch, pages_per_seq).astype(jnp.int32)
    lengths = jax.random.randint(kl, (batch,), min_len, pages_per_seq * page_size + 1, dtype=jnp.int32)
    return (q, k_pages, v_pages, page_table, lengths), {}


def reference(q, k_pages, v_pages, page_table, lengths):
    batch, q_heads, head_dim = q.shape
    kv_heads, _, page_size, _ = k_pages.shape
    pages_per_seq = page_table.shape[1]
    max_len = pages_per_seq * page_size
    group = q_heads // kv_heads
    # Gather each sequence's pages in logical order: [kv_heads, batch, max_len, head_dim].
    k = k_pages[:, page_table].reshape(kv_heads, batch, max_len, head_dim).astype(jnp.float32)
    v = v_pages[:, page_table].reshape(kv_heads, batch, max_len, head_dim).astype(jnp.float32)
    qf = q.astype(jnp.float32).reshape(batch, kv_heads, group, head_dim)
    scores = jnp.einsum("bngd,nbtd->bngt", qf, k) / math.sqrt(head_dim)
    valid = jnp.arange(max_len)[None, :] < lengths[:, None]  # [batch, max_len]
    scores = jnp.where(valid[:, None, None, :], scores, -jnp.inf)
    m = jnp.max(scores, axis=-1, keepdims=True)
    p = jnp.exp(scores - m)
    denom = jnp.sum(p, axis=-1, keepdims=True)
    out = jnp.einsum("bngt,nbtd->bngd", p, v) / denom
    return out.reshape(batch, q_heads, head_dim).astype(jnp.bfloat16)
