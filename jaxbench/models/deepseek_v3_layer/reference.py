"""DeepSeek-V3 decoder layer: multi-head latent attention (MLA) and a sigmoid-routed MoE with a shared expert."""

import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, seq, hidden, heads, q_rank, kv_rank, nope_dim, rope_dim, v_dim, experts,
               intermediate, top_k):
    ks = jax.random.split(key, 18)

    def w(k, shape):
        return jax.random.normal(k, shape, jnp.float32) / jnp.sqrt(shape[-2])

    def scale(k, n):
        return 1.0 + 0.1 * jax.random.normal(k, (n,), jnp.float32)

    x = jax.random.normal(ks[0], (batch, seq, hidden), jnp.float32)
    args = (x, scale(ks[1], hidden), w(ks[2], (hidden, q_rank)), scale(ks[3], q_rank),
            w(ks[4], (q_rank, heads * (nope_dim + rope_dim))), w(ks[5], (hidden, kv_rank + rope_dim)),
            scale(ks[6], kv_rank), w(ks[7], (kv_rank, heads * (nope_dim + v_dim))), w(ks[8], (heads * v_dim, hidden)),
            scale(ks[9], hidden), w(ks[10], (hidden, experts)), 0.1 * jax.random.normal(ks[11], (experts,)),
            w(ks[12], (experts, hidden, intermediate)), w(ks[13], (experts, hidden, intermediate)),
            w(ks[14], (experts, intermediate, hidden)), w(ks[15], (hidden, intermediate)),
            w(ks[16], (hidden, intermediate)), w(ks[17], (intermediate, hidden)))
    static = {"heads": heads, "nope_dim": nope_dim, "rope_dim": rope_dim, "v_dim": v_dim, "top_k": top_k,
              "route_scale": 2.5, "eps": 1e-6, "theta": 10000.0}
    return args, static


def rms_norm(x, weight, eps):
    return x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + eps) * weight


def rope(x, theta):
    seq, dim = x.shape[-2], x.shape[-1]
    inv = 1.0 / (theta ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
    ang = jnp.arange(seq, dtype=jnp.float32)[:, None] * inv[None, :]
    x1, x2 = x[..., : dim // 2], x[..., dim // 2 :]
    return jnp.concatenate([x1 * jnp.cos(ang) - x2 * jnp.sin(ang), x2 * jnp.cos(ang) + x1 * jnp.sin(ang)], axis=-1)


def swiglu(h, w_gate, w_up, w_down):
    return (jax.nn.silu(h @ w_gate) * (h @ w_up)) @ w_down


def reference(x, attn_norm, wq_a, q_norm, wq_b, wkv_a, kv_norm, wkv_b, wo, mlp_norm, router, router_bias, e_gate,
              e_up, e_down, s_gate, s_up, s_down, *, heads, nope_dim, rope_dim, v_dim, top_k, route_scale, eps, theta):
    b, s, d = x.shape
    kv_rank = kv_norm.shape[0]
    h = rms_norm(x, attn_norm, eps)
    q = (rms_norm(h @ wq_a, q_norm, eps) @ wq_b).reshape(b, s, heads, nope_dim + rope_dim).transpose(0, 2, 1, 3)
    q_nope, q_rope = q[..., :nope_dim], rope(q[..., nope_dim:], theta)
    kv_a = h @ wkv_a
    latent, k_rope = rms_norm(kv_a[..., :kv_rank], kv_norm, eps), rope(kv_a[..., None, kv_rank:].transpose(0, 2, 1, 3), theta)
    kv = (latent @ wkv_b).reshape(b, s, heads, nope_dim + v_dim).transpose(0, 2, 1, 3)
    k_nope, v = kv[..., :nope_dim], kv[..., nope_dim:]
    scores = (jnp.einsum("bhqd,bhkd->bhqk", q_nope, k_nope) + jnp.einsum("bhqd,bxkd->bhqk", q_rope, k_rope))
    scores = scores / jnp.sqrt(jnp.float32(nope_dim + rope_dim))
    probs = jax.nn.softmax(jnp.where(jnp.tril(jnp.ones((s, s), dtype=bool)), scores, -jnp.inf), axis=-1)
    attn = jnp.einsum("bhqk,bhkd->bhqd", probs, v).transpose(0, 2, 1, 3).reshape(b, s, heads * v_dim)
    x = x + attn @ wo
    h = rms_norm(x, mlp_norm, eps).reshape(b * s, d)
    affinity = jax.nn.sigmoid(h @ router)
    _, top_idx = jax.lax.top_k(affinity + router_bias, top_k)  # the bias picks experts, never weights them
    chosen = jnp.take_along_axis(affinity, top_idx, axis=-1)
    chosen = route_scale * chosen / jnp.sum(chosen, axis=-1, keepdims=True)
    gates = jnp.sum(jax.nn.one_hot(top_idx, router.shape[1], dtype=h.dtype) * chosen[..., None], axis=1)
    act = jax.nn.silu(jnp.einsum("td,edf->etf", h, e_gate)) * jnp.einsum("td,edf->etf", h, e_up)
    routed = jnp.einsum("etd,te->td", jnp.einsum("etf,efd->etd", act, e_down), gates)
    return x + (routed + swiglu(h, s_gate, s_up, s_down)).reshape(b, s, d)
