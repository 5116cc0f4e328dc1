"""Mamba-2 block in bf16: RMSNorm, input projection, causal depthwise conv, selective state-space scan, gated
norm.

Activations, projection and conv weights and the residual stream are bf16 as the model runs; A_log, dt_bias
and D are float32 parameters (as in mamba_ssm), the conv accumulates in float32, dt, the decay and the scan's
state are float32 (as mamba_ssm's scan kernels keep them), the gated RMSNorm runs in float32, and every
matmul accumulates in float32 (``wide``). Called on float64 inputs the same code is the float64 evaluation of
the same math that the tolerance is measured against.
"""

import jax
import jax.numpy as jnp


def get_inputs(key, *, batch, seq, d_model, d_state, expand, head_dim, d_conv):
    d_inner = expand * d_model
    heads = d_inner // head_dim
    conv_dim = d_inner + 2 * d_state
    ks = jax.random.split(key, 9)
    bf16 = jnp.bfloat16
    args = (jax.random.normal(ks[0], (batch, seq, d_model), jnp.float32).astype(bf16),
            (1.0 + 0.1 * jax.random.normal(ks[1], (d_model,))).astype(bf16),
            (jax.random.normal(ks[2], (d_model, 2 * d_inner + 2 * d_state + heads)) / jnp.sqrt(d_model)).astype(bf16),
            (jax.random.normal(ks[3], (d_conv, conv_dim)) / jnp.sqrt(d_conv)).astype(bf16),
            jnp.log(jax.random.uniform(ks[4], (heads,), minval=1.0, maxval=16.0)),
            jax.random.uniform(ks[5], (heads,), minval=-4.0, maxval=-2.0),
            1.0 + 0.1 * jax.random.normal(ks[6], (heads,)),
            (1.0 + 0.1 * jax.random.normal(ks[7], (d_inner,))).astype(bf16),
            (jax.random.normal(ks[8], (d_inner, d_model)) / jnp.sqrt(d_inner)).astype(bf16))
    return args, {"d_state": d_state, "head_dim": head_dim, "eps": 1e-5}


def wide(x):
    return jnp.promote_types(x.dtype, jnp.float32)


def matmul(a, b):
    return jnp.matmul(a, b, preferred_element_type=wide(a)).astype(a.dtype)


def rms_norm(x, weight, eps):
    f = x.astype(wide(x))
    return weight * (f * jax.lax.rsqrt(jnp.mean(jnp.square(f), axis=-1, keepdims=True) + eps)).astype(x.dtype)


def reference(x, norm, w_in, conv_w, a_log, dt_bias, d_skip, gate_norm, w_out, *, d_state, head_dim, eps):
    b, s, _ = x.shape
    acc = wide(x)
    d_inner, heads = w_out.shape[0], a_log.shape[0]
    proj = matmul(rms_norm(x, norm, eps), w_in)
    z, xbc, dt = proj[..., :d_inner], proj[..., d_inner : 2 * d_inner + 2 * d_state], proj[..., -heads:]
    width = conv_w.shape[0]
    padded = jnp.pad(xbc.astype(acc), ((0, 0), (width - 1, 0), (0, 0)))
    conv = sum(padded[:, i : i + s] * conv_w[i].astype(acc) for i in range(width))
    xbc = jax.nn.silu(conv.astype(x.dtype)).astype(acc)
    xs = xbc[..., :d_inner].reshape(b, s, heads, head_dim)
    bmat, cmat = xbc[..., d_inner : d_inner + d_state], xbc[..., d_inner + d_state :]
    dt = jax.nn.softplus(dt.astype(acc) + dt_bias)
    decay = jnp.exp(dt * -jnp.exp(a_log))

    def step(state, inputs):
        x_t, b_t, c_t, dt_t, a_t = inputs
        state = a_t[..., None, None] * state + (dt_t[..., None] * x_t)[..., None] * b_t[:, None, None, :]
        return state, jnp.einsum("bhpn,bn->bhp", state, c_t)

    seq_first = (xs, bmat, cmat, dt, decay)
    init = jnp.zeros((b, heads, head_dim, d_state), acc)
    _, ys = jax.lax.scan(step, init, tuple(jnp.moveaxis(a, 1, 0) for a in seq_first))
    y = jnp.moveaxis(ys, 0, 1) + xs * d_skip[:, None]
    y = y.reshape(b, s, d_inner) * jax.nn.silu(z.astype(acc))
    y = (y * jax.lax.rsqrt(jnp.mean(jnp.square(y), axis=-1, keepdims=True) + eps)).astype(x.dtype) * gate_norm
    return x + matmul(y, w_out)
