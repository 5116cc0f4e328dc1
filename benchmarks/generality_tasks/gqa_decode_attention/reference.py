"""One decode step of grouped-query attention: one query token per sequence over a contiguous KV cache,
each sequence attending to its own first ``seq_lens[b]`` cached positions."""

import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, num_q_heads, num_kv_heads, head_dim, cache_len):
    kq, kk, kv, kl = jax.random.split(key, 4)
    query = jax.random.normal(kq, (batch, num_q_heads, head_dim), jnp.float32).astype(jnp.bfloat16)
    key_cache = jax.random.normal(kk, (batch, cache_len, num_kv_heads, head_dim), jnp.float32).astype(jnp.bfloat16)
    value_cache = jax.random.normal(kv, (batch, cache_len, num_kv_heads, head_dim), jnp.float32).astype(jnp.bfloat16)
    seq_lens = jax.random.randint(kl, (batch,), 1, cache_len + 1, dtype=jnp.int32)
    return (query, key_cache, value_cache, seq_lens), {}


def reference(query, key_cache, value_cache, seq_lens):
    b, hq, d = query.shape
    t, hkv = key_cache.shape[1], key_cache.shape[2]
    q = query.reshape(b, hkv, hq // hkv, d)
    logits = jnp.einsum("bkgd,btkd->bkgt", q, key_cache, preferred_element_type=jnp.float32) * d**-0.5
    mask = jnp.arange(t)[None, :] < seq_lens[:, None]
    logits = jnp.where(mask[:, None, None, :], logits, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(logits, axis=-1)
    out = jnp.einsum("bkgt,btkd->bkgd", probs.astype(value_cache.dtype), value_cache,
                     preferred_element_type=jnp.float32)
    return out.reshape(b, hq, d).astype(query.dtype)
