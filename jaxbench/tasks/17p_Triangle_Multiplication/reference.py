"""AlphaFold2 triangle multiplicative update using outgoing edges on a pair representation."""

import jax
import jax.numpy as jnp

_HI = jax.lax.Precision.HIGHEST


def _dense(key, fan_in, fan_out):
    kw, kb = jax.random.split(key)
    w = jax.random.normal(kw, (fan_in, fan_out), jnp.float32) / jnp.sqrt(float(fan_in))
    b = 0.2 * jax.random.normal(kb, (fan_out,), jnp.float32)
    return w, b


def _norm_params(key, width):
    ks, kb = jax.random.split(key)
    scale = 1.0 + 0.2 * jax.random.normal(ks, (width,), jnp.float32)
    bias = 0.2 * jax.random.normal(kb, (width,), jnp.float32)
    return scale, bias


def get_inputs(key, *, batch, n_res, c_pair, c_hidden):
    keys = jax.random.split(key, 9)
    z = 0.5 + 2.0 * jax.random.normal(keys[0], (batch, n_res, n_res, c_pair), jnp.float32)
    ln_in_scale, ln_in_bias = _norm_params(keys[1], c_pair)
    w_a_gate, b_a_gate = _dense(keys[2], c_pair, c_hidden)
    w_a, b_a = _dense(keys[3], c_pair, c_hidden)
    w_b_gate, b_b_gate = _dense(keys[4], c_pair, c_hidden)
    w_b, b_b = _dense(keys[5], c_pair, c_hidden)
    ln_out_scale, ln_out_bias = _norm_params(keys[6], c_hidden)
    w_gate, b_gate = _dense(keys[7], c_pair, c_pair)
    w_out, b_out = _dense(keys[8], c_hidden, c_pair)
    args = (
        z,
        ln_in_scale, ln_in_bias,
        w_a_gate, b_a_gate, w_a, b_a,
        w_b_gate, b_b_gate, w_b, b_b,
        ln_out_scale, ln_out_bias,
        w_gate, b_gate, w_out, b_out,
    )
    return args, {"eps": 1e-5}


def _layer_norm(x, scale, bias, eps):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * scale + bias


def _linear(x, w, b):
    return jnp.einsum("...i,io->...o", x, w, precision=_HI) + b


def reference(
    z,
    ln_in_scale, ln_in_bias,
    w_a_gate, b_a_gate, w_a, b_a,
    w_b_gate, b_b_gate, w_b, b_b,
    ln_out_scale, ln_out_bias,
    w_gate, b_gate, w_out, b_out,
    *, eps,
):
    zn = _layer_norm(z, ln_in_scale, ln_in_bias, eps)
    a = jax.nn.sigmoid(_linear(zn, w_a_gate, b_a_gate)) * _linear(zn, w_a, b_a)
    b = jax.nn.sigmoid(_linear(zn, w_b_gate, b_b_gate)) * _linear(zn, w_b, b_b)
    # Outgoing edges: x[i, j, c] = sum_k a[i, k, c] * b[j, k, c].
    x = jnp.einsum("bikc,bjkc->bijc", a, b, precision=_HI)
    xn = _layer_norm(x, ln_out_scale, ln_out_bias, eps)
    return jax.nn.sigmoid(_linear(zn, w_gate, b_gate)) * _linear(xn, w_out, b_out)
