"""Mamba-2 SSD: the selective state-space recurrence with scalar-per-head decay, computed in chunked
(state space duality) form: a masked quadratic form inside each chunk plus a scan of chunk-end states."""

import math

import jax
import jax.numpy as jnp

_HI = jax.lax.Precision.HIGHEST


def get_inputs(key, *, batch, seq, heads, head_dim, groups, state_dim):
    kx, kt, ka, kb, kc, kd = jax.random.split(key, 6)
    x = jax.random.normal(kx, (batch, seq, heads, head_dim), jnp.float32)
    dt = jax.nn.softplus(jax.random.normal(kt, (batch, seq, heads), jnp.float32) - 3.0)
    a = -jnp.exp(jax.random.uniform(ka, (heads,), jnp.float32, math.log(0.1), math.log(8.0)))
    b = jax.random.normal(kb, (batch, seq, groups, state_dim), jnp.float32)
    c = jax.random.normal(kc, (batch, seq, groups, state_dim), jnp.float32)
    d = jax.random.uniform(kd, (heads,), jnp.float32, 0.5, 1.5)
    return (x, dt, a, b, c, d), {}


def reference(x, dt, a, b, c, d):
    bsz, seq, heads, hdim = x.shape
    groups, nstate = b.shape[2], b.shape[3]
    rep = heads // groups
    q = math.gcd(seq, 128)  # chunk length
    nc = seq // q

    # Chunked views; heads split as (group, head-within-group) so B and C are shared inside a group.
    xs = x.reshape(bsz, nc, q, groups, rep, hdim)
    dts = dt.reshape(bsz, nc, q, groups, rep)
    bs = b.reshape(bsz, nc, q, groups, nstate)
    cs = c.reshape(bsz, nc, q, groups, nstate)
    la = dts * a.reshape(groups, rep)  # log decay per step, <= 0
    cum = jnp.cumsum(la, axis=2)  # [b, nc, q, g, r], inclusive
    total = cum[:, :, -1]  # [b, nc, g, r]

    # Within-chunk (diagonal block) part: y_i += sum_{j<=i} (C_i.B_j) exp(cum_i - cum_j) dt_j x_j.
    idx = jnp.arange(q)
    lower = idx[:, None] >= idx[None, :]
    gap = cum[:, :, :, None] - cum[:, :, None, :]  # [b, nc, i, j, g, r]
    seg = jnp.where(lower[None, None, :, :, None, None], jnp.exp(jnp.where(lower[..., None, None], gap, 0.0)), 0.0)
    cb = jnp.einsum("bcign,bcjgn->bcijg", cs, bs, precision=_HI)
    w = cb[..., None] * seg * dts[:, :, None]  # [b, nc, i, j, g, r]
    y_in = jnp.einsum("bcijgr,bcjgrp->bcigrp", w, xs, precision=_HI)

    # State contributed by each chunk at its end: sum_j exp(total - cum_j) dt_j B_j x_j^T.
    wend = jnp.exp(total[:, :, None] - cum) * dts  # [b, nc, q, g, r]
    chunk_states = jnp.einsum("bcjgn,bcjgr,bcjgrp->bcgrpn", bs, wend, xs, precision=_HI)

    # Carry states across chunks: h_entering[c] = exp(total[c-1]) h_entering[c-1] + chunk_states[c-1].
    def step(h, inp):
        tot, st = inp
        return jnp.exp(tot)[..., None, None] * h + st, h

    h0 = jnp.zeros((bsz, groups, rep, hdim, nstate), jnp.float32)
    _, h_enter = jax.lax.scan(step, h0, (jnp.moveaxis(total, 1, 0), jnp.moveaxis(chunk_states, 1, 0)))
    h_enter = jnp.moveaxis(h_enter, 0, 1)  # [b, nc, g, r, p, n]

    # Contribution of the entering state: y_i += exp(cum_i) C_i . h_enter.
    y_off = jnp.einsum("bcign,bcgrpn->bcigrp", cs, h_enter, precision=_HI) * jnp.exp(cum)[..., None]

    y = (y_in + y_off).reshape(bsz, seq, heads, hdim)
    return y + d[:, None] * x
