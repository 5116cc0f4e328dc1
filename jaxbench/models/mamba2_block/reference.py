"""Mamba-2 block: RMSNorm, input projection, causal depthwise conv, selective state-space scan, gated norm."""

import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, seq, d_model, d_state, expand, head_dim, d_conv):
    d_inner = expand * d_model
    heads = d_inner // head_dim
    conv_dim = d_inner + 2 * d_state
    ks = jax.random.split(key, 9)
    x = jax.random.normal(ks[0], (batch, seq, d_model), jnp.float32)
    args = (x, 1.0 + 0.1 * jax.random.normal(ks[1], (d_model,)),
            jax.random.normal(ks[2], (d_model, 2 * d_inner + 2 * d_state + heads)) / jnp.sqrt(d_model),
            jax.random.normal(ks[3], (d_conv, conv_dim)) / jnp.sqrt(d_conv),
            jnp.log(jax.random.uniform(ks[4], (heads,), minval=1.0, maxval=16.0)),
            jax.random.uniform(ks[5], (heads,), minval=-4.0, maxval=-2.0),
            1.0 + 0.1 * jax.random.normal(ks[6], (heads,)), 1.0 + 0.1 * jax.random.normal(ks[7], (d_inner,)),
            jax.random.normal(ks[8], (d_inner, d_model)) / jnp.sqrt(d_inner))
    return args, {"d_state": d_state, "head_dim": head_dim, "eps": 1e-5}


def rms_norm(x, weight, eps):
    return x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + eps) * weight


def reference(x, norm, w_in, conv_w, a_log, dt_bias, d_skip, gate_norm, w_out, *, d_state, head_dim, eps):
    b, s, _ = x.shape
    d_inner, heads = w_out.shape[0], a_log.shape[0]
    proj = rms_norm(x, norm, eps) @ w_in
    z, xbc, dt = proj[..., :d_inner], proj[..., d_inner : 2 * d_inner + 2 * d_state], proj[..., -heads:]
    width = conv_w.shape[0]
    padded = jnp.pad(xbc, ((0, 0), (width - 1, 0), (0, 0)))
    xbc = jax.nn.silu(sum(padded[:, i : i + s] * conv_w[i] for i in range(width)))
    xs = xbc[..., :d_inner].reshape(b, s, heads, head_dim)
    bmat, cmat = xbc[..., d_inner : d_inner + d_state], xbc[..., d_inner + d_state :]
    dt = jax.nn.softplus(dt + dt_bias)
    decay = jnp.exp(dt * -jnp.exp(a_log))

    def step(state, inputs):
        x_t, b_t, c_t, dt_t, a_t = inputs
        state = a_t[..., None, None] * state + (dt_t[..., None] * x_t)[..., None] * b_t[:, None, None, :]
        return state, jnp.einsum("bhpn,bn->bhp", state, c_t)

    seq_first = (xs, bmat, cmat, dt, decay)
    init = jnp.zeros((b, heads, head_dim, d_state), jnp.float32)
    _, ys = jax.lax.scan(step, init, tuple(jnp.moveaxis(a, 1, 0) for a in seq_first))
    y = jnp.moveaxis(ys, 0, 1) + xs * d_skip[:, None]
    y = rms_norm(y.reshape(b, s, d_inner) * jax.nn.silu(z), gate_norm, eps)
    return x + y @ w_out
