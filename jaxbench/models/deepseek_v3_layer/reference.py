"""DeepSeek-V3 decoder layer in bf16: multi-head latent attention (MLA) and a sigmoid-routed MoE with a shared
expert.

Activations, weights and the residual stream are bf16 as the model runs; the routing bias is float32 (as in
DeepSeek's inference code), norm statistics, RoPE, attention scores and softmax, and the router's sigmoid
affinities and top-k are float32, and every matmul accumulates in float32 (``wide``). Each token of ``x``
leans towards ``top_k`` experts drawn for it, so the router's top-k margin is far above bf16 rounding and the
choice never flips between numerics. Called on float64 inputs the same code is the float64 evaluation of the
same math that the tolerance is measured against.
"""

import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, seq, hidden, heads, q_rank, kv_rank, nope_dim, rope_dim, v_dim, experts,
               intermediate, top_k):
    ks = jax.random.split(key, 19)

    def w(k, shape):
        return jax.random.normal(k, shape, jnp.float32) / jnp.sqrt(shape[-2])

    def scale(k, n):
        return 1.0 + 0.1 * jax.random.normal(k, (n,), jnp.float32)

    router = w(ks[10], (hidden, experts))
    x = jax.random.normal(ks[0], (batch, seq, hidden), jnp.float32) + leaning(ks[18], router, (batch, seq), top_k)
    args = [x, scale(ks[1], hidden), w(ks[2], (hidden, q_rank)), scale(ks[3], q_rank),
            w(ks[4], (q_rank, heads * (nope_dim + rope_dim))), w(ks[5], (hidden, kv_rank + rope_dim)),
            scale(ks[6], kv_rank), w(ks[7], (kv_rank, heads * (nope_dim + v_dim))), w(ks[8], (heads * v_dim, hidden)),
            scale(ks[9], hidden), router, 0.01 * jax.random.normal(ks[11], (experts,)),
            w(ks[12], (experts, hidden, intermediate)), w(ks[13], (experts, hidden, intermediate)),
            w(ks[14], (experts, intermediate, hidden)), w(ks[15], (hidden, intermediate)),
            w(ks[16], (hidden, intermediate)), w(ks[17], (intermediate, hidden))]
    args = tuple(a if i == 11 else a.astype(jnp.bfloat16) for i, a in enumerate(args))
    static = {"heads": heads, "nope_dim": nope_dim, "rope_dim": rope_dim, "v_dim": v_dim, "top_k": top_k,
              "route_scale": 2.5, "eps": 1e-6, "theta": 10000.0}
    return args, static


def leaning(key, router, tokens, top_k, strength=12.0):
    """A push along the router columns of ``top_k`` experts drawn per token (columns of norm about one)."""
    draw = jax.random.uniform(key, tokens + (router.shape[1],))
    picked = (draw >= jnp.sort(draw, axis=-1)[..., -top_k:-top_k + 1]).astype(jnp.float32)
    return strength * picked @ router.T


def wide(x):
    return jnp.promote_types(x.dtype, jnp.float32)


def matmul(a, b):
    return jnp.matmul(a, b, preferred_element_type=wide(a)).astype(a.dtype)


def rms_norm(x, weight, eps):
    f = x.astype(wide(x))
    return weight * (f * jax.lax.rsqrt(jnp.mean(jnp.square(f), axis=-1, keepdims=True) + eps)).astype(x.dtype)


def rope(x, theta):
    seq, dim, acc = x.shape[-2], x.shape[-1], wide(x)
    inv = 1.0 / (theta ** (jnp.arange(0, dim, 2, dtype=acc) / dim))
    ang = jnp.arange(seq, dtype=acc)[:, None] * inv[None, :]
    f = x.astype(acc)
    x1, x2 = f[..., : dim // 2], f[..., dim // 2 :]
    rotated = [x1 * jnp.cos(ang) - x2 * jnp.sin(ang), x2 * jnp.cos(ang) + x1 * jnp.sin(ang)]
    return jnp.concatenate(rotated, axis=-1).astype(x.dtype)


def swiglu(h, w_gate, w_up, w_down):
    return matmul(jax.nn.silu(matmul(h, w_gate)) * matmul(h, w_up), w_down)


def reference(x, attn_norm, wq_a, q_norm, wq_b, wkv_a, kv_norm, wkv_b, wo, mlp_norm, router, router_bias, e_gate,
              e_up, e_down, s_gate, s_up, s_down, *, heads, nope_dim, rope_dim, v_dim, top_k, route_scale, eps, theta):
    b, s, d = x.shape
    kv_rank = kv_norm.shape[0]
    h = rms_norm(x, attn_norm, eps)
    q = matmul(rms_norm(matmul(h, wq_a), q_norm, eps), wq_b)
    q = q.reshape(b, s, heads, nope_dim + rope_dim).transpose(0, 2, 1, 3)
    q_nope, q_rope = q[..., :nope_dim], rope(q[..., nope_dim:], theta)
    kv_a = matmul(h, wkv_a)
    latent = rms_norm(kv_a[..., :kv_rank], kv_norm, eps)
    k_rope = rope(kv_a[..., None, kv_rank:].transpose(0, 2, 1, 3), theta)
    kv = matmul(latent, wkv_b).reshape(b, s, heads, nope_dim + v_dim).transpose(0, 2, 1, 3)
    k_nope, v = kv[..., :nope_dim], kv[..., nope_dim:]
    acc = wide(q)
    scores = (jnp.einsum("bhqd,bhkd->bhqk", q_nope, k_nope, preferred_element_type=acc)
              + jnp.einsum("bhqd,bxkd->bhqk", q_rope, k_rope, preferred_element_type=acc))
    scores = scores / jnp.sqrt(jnp.float32(nope_dim + rope_dim))
    probs = jax.nn.softmax(jnp.where(jnp.tril(jnp.ones((s, s), dtype=bool)), scores, -jnp.inf), axis=-1)
    attn = jnp.einsum("bhqk,bhkd->bhqd", probs.astype(q.dtype), v, preferred_element_type=acc).astype(q.dtype)
    x = x + matmul(attn.transpose(0, 2, 1, 3).reshape(b, s, heads * v_dim), wo)
    h = rms_norm(x, mlp_norm, eps).reshape(b * s, d)
    affinity = jax.nn.sigmoid(jnp.matmul(h, router, preferred_element_type=wide(h)))
    _, top_idx = jax.lax.top_k(affinity + router_bias, top_k)  # the bias picks experts, never weights them
    chosen = jnp.take_along_axis(affinity, top_idx, axis=-1)
    chosen = route_scale * chosen / jnp.sum(chosen, axis=-1, keepdims=True)
    gates = jnp.sum(jax.nn.one_hot(top_idx, router.shape[1], dtype=chosen.dtype) * chosen[..., None], axis=1)
    gate = jnp.einsum("td,edf->etf", h, e_gate)
    up = jnp.einsum("td,edf->etf", h, e_up)
    out = jnp.einsum("etf,efd->etd", jax.nn.silu(gate) * up, e_down)
    routed = jnp.einsum("etd,te->td", out, gates.astype(h.dtype), preferred_element_type=wide(h)).astype(h.dtype)
    return x + (routed + swiglu(h, s_gate, s_up, s_down)).reshape(b, s, d)
