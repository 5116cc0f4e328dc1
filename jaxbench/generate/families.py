"""The grammar's families: each draws one realistic computation of current models as a :class:`Draft`.

A family is a function ``(rng, dtype, decode) -> Draft``. What varies inside a family (the blocks it is
made of, layouts, names and spelling) is drawn from ``rng``; ``dtype`` and ``decode`` come from the mix so
that its quotas hold. Sizes: ``cpu`` lands in ``task_check``'s time window on a small CPU; ``full`` is a
served shape (prefill tokens, or a decode batch with its KV cache).
"""

from __future__ import annotations

import random
from typing import Callable

from jaxbench.generate import blocks
from jaxbench.generate.blocks import indent
from jaxbench.generate.draft import JNP_DTYPE, Draft, Namer, code

Family = Callable[[random.Random, str, bool], Draft]


def projection(rng: random.Random, dtype: str, decode: bool) -> Draft:
    """A linear layer with an optional prologue (input scale) and an epilogue chain (bias, activation, residual)."""
    n = Namer(rng)
    bf16 = dtype == "bfloat16"
    x, w, b, r = n.pick("x", "h", "inp", "act"), n.pick("w", "weight", "kernel", "w_out"), "bias", "residual"
    t, k, m = n.pick("tokens", "rows", "n_tok"), n.pick("d_in", "d_model", "k_dim"), n.pick("d_out", "n_dim", "units")
    act = rng.choice(blocks.ACTIVATIONS)
    use_bias, use_res, prologue = n.flag(0.7), n.flag(0.4), n.flag(0.3)
    args = [x, w] + ([b] if use_bias else []) + ([r] if use_res else [])
    y = n.pick("y", "out", "z")
    body = []
    if prologue:
        body.append(f"{x} = {x} * scale_in")
    body.append(f"{y} = " + blocks.matmul(n, x, w, "tk", "kn", "tn", acc=bf16))
    if use_bias:
        body.append(f"{y} = {y} + {b}" + (".astype(jnp.float32)" if bf16 else ""))
    body.append(f"{y} = " + blocks.activation(n, act, y))
    if use_res:
        body.append(f"{y} = {y} + {r}" + (".astype(jnp.float32)" if bf16 else ""))
    body.append(f"return {y}.astype({x}.dtype)" if bf16 else f"return {y}")
    statics = ["scale_in"] if prologue else []
    dt = JNP_DTYPE[dtype]
    draws = [f"{x} = jax.random.normal(keys[0], ({t}, {k}), jnp.float32).astype({dt})",
             f"{w} = (jax.random.normal(keys[1], ({k}, {m}), jnp.float32) / jnp.sqrt({k})).astype({dt})"]
    if use_bias:
        draws.append(f"{b} = (0.1 * jax.random.normal(keys[2], ({m},), jnp.float32)).astype({dt})")
    if use_res:
        draws.append(f"{r} = jax.random.normal(keys[3], ({t}, {m}), jnp.float32).astype({dt})")
    static_dict = "{" + ", ".join(f'"{s}": 0.5' for s in statics) + "}"
    kw = (", *, " + ", ".join(statics)) if statics else ""
    src = code(f'''
        """Linear layer: {'scaled input, ' if prologue else ''}matmul{', bias' if use_bias else ''}, {act}{', residual add' if use_res else ''}."""

        import jax
        import jax.numpy as jnp


        def get_inputs(key, *, {t}, {k}, {m}):
            keys = jax.random.split(key, 4)
        {indent(draws)}
            return ({", ".join(args)},), {static_dict}


        def reference({", ".join(args)}{kw}):
        {indent(body)}
    ''')
    cpu = {t: 256, k: 2048, m: 2048} if decode else {t: 512, k: 1024, m: 2048}
    full = {t: 256, k: 4096, m: 14336} if decode else {t: 8192, k: 4096, m: rng.choice([4096, 11008, 14336])}
    return Draft("projection", f"Linear_{act}", "matmul",
                 f"y = {act}(x @ w{' + bias' if use_bias else ''}){' + residual' if use_res else ''} over {t} rows; "
                 f"{'bfloat16 operands, float32 accumulation' if bf16 else 'float32 at default matmul precision'}.",
                 dtype, decode, src, {"cpu": cpu, "full": full}, {t: {}},
                 ["matmul", act] + (["bias"] if use_bias else []) + (["residual"] if use_res else []))


def norm_projection(rng: random.Random, dtype: str, decode: bool) -> Draft:
    """A norm feeding a projection (pre-norm QKV or MLP input), the projection split into heads."""
    n = Namer(rng)
    bf16 = dtype == "bfloat16"
    kind = rng.choice(["rms", "layer"])
    x, w = n.pick("hidden", "x", "h"), n.pick("w_qkv", "proj", "w_in")
    g, beta = n.pick("gamma", "norm_w", "scale"), "beta"
    t, d, heads, hd = n.pick("tokens", "seq"), n.pick("d_model", "hidden"), "heads", "head_dim"
    xn = n.pick("normed", "xn", "h_norm")
    lines = (blocks.rms_norm_lines(n, x, g, "eps", xn, bf16) if kind == "rms"
             else blocks.layer_norm_lines(n, x, g, beta, "eps", xn, bf16))
    proj = blocks.matmul(n, xn, w, "td", "de", "te", acc=bf16)
    lines += [f"out = {proj}", f"return out.reshape(out.shape[0], heads, -1){'.astype(' + x + '.dtype)' if bf16 else ''}"]
    params = [x, g] + ([beta] if kind == "layer" else []) + [w]
    dt = JNP_DTYPE[dtype]
    src = code(f'''
        """{'RMSNorm' if kind == 'rms' else 'LayerNorm'} then a projection into {heads} heads."""

        import jax
        import jax.numpy as jnp


        def get_inputs(key, *, {t}, {d}, {heads}, {hd}):
            k1, k2, k3, k4 = jax.random.split(key, 4)
            {x} = (2.0 * jax.random.normal(k1, ({t}, {d}), jnp.float32) + 0.3).astype({dt})
            {g} = (1.0 + 0.1 * jax.random.normal(k2, ({d},), jnp.float32)).astype({dt})
            {"beta = (0.1 * jax.random.normal(k4, (" + d + ",), jnp.float32)).astype(" + dt + ")" if kind == "layer" else ""}
            {w} = (jax.random.normal(k3, ({d}, {heads} * {hd}), jnp.float32) / {d} ** 0.5).astype({dt})
            return ({", ".join(params)},), {{"eps": 1e-6, "heads": {heads}}}


        def reference({", ".join(params)}, *, eps, heads):
        {indent(lines)}
    ''')
    cpu = {t: 64, d: 2048, heads: 16, hd: 128} if decode else {t: 512, d: 1024, heads: 16, hd: 128}
    full = {t: 128, d: 4096, heads: 48, hd: 128} if decode else {t: 8192, d: 4096, heads: 48, hd: 128}
    return Draft("norm_projection", f"{kind.upper()}Norm_Projection", "matmul",
                 f"{kind} norm over {d} (eps 1e-6) then x @ w reshaped to [{t}, heads, head_dim].",
                 dtype, decode, src, {"cpu": cpu, "full": full}, {t: {}}, [f"{kind}_norm", "matmul"])


def norm(rng: random.Random, dtype: str, decode: bool) -> Draft:
    """Residual add and a norm; returns the normalized value and the updated residual stream."""
    n = Namer(rng)
    bf16 = dtype == "bfloat16"
    kind = rng.choice(["rms", "layer"])
    x, res, g, beta = n.pick("x", "delta", "block_out"), n.pick("residual", "stream", "skip"), n.pick("weight", "gamma"), "bias"
    rows, d = n.pick("rows", "tokens", "batch"), n.pick("hidden", "dim", "width")
    s = n.pick("summed", "h", "resid")
    lines = [f"{s} = {x} + {res}"]
    out = n.pick("y", "normed", "out")
    lines += (blocks.rms_norm_lines(n, s, g, "eps", out, bf16) if kind == "rms"
              else blocks.layer_norm_lines(n, s, g, beta, "eps", out, bf16))
    lines.append(f"return {out}, {s}")
    params = [x, res, g] + ([beta] if kind == "layer" else [])
    dt = JNP_DTYPE[dtype]
    src = code(f'''
        """Residual add followed by {'RMSNorm' if kind == 'rms' else 'LayerNorm'}; returns (normed, new residual)."""

        import jax
        import jax.numpy as jnp


        def get_inputs(key, *, {rows}, {d}):
            ks = jax.random.split(key, 4)
            {x} = jax.random.normal(ks[0], ({rows}, {d}), jnp.float32).astype({dt})
            {res} = (3.0 * jax.random.normal(ks[1], ({rows}, {d}), jnp.float32)).astype({dt})
            {g} = (1.0 + 0.1 * jax.random.normal(ks[2], ({d},), jnp.float32)).astype({dt})
            {"bias = (0.1 * jax.random.normal(ks[3], (" + d + ",), jnp.float32)).astype(" + dt + ")" if kind == "layer" else ""}
            return ({", ".join(params)},), {{"eps": {rng.choice(["1e-5", "1e-6"])}}}


        def reference({", ".join(params)}, *, eps):
        {indent(lines)}
    ''')
    cpu = {rows: 1024, d: 4096} if decode else {rows: 2048, d: 2048}
    full = {rows: 256, d: 8192} if decode else {rows: 16384, d: 4096}
    return Draft("norm", f"Residual_{kind.upper()}Norm", "normalization",
                 f"s = x + residual; y = {kind}norm(s); returns (y, s).", dtype, decode, src,
                 {"cpu": cpu, "full": full}, {rows: {}}, ["residual", f"{kind}_norm"])


def softmax(rng: random.Random, dtype: str, decode: bool) -> Draft:
    """A softmax variant over the last axis: temperature, a key mask, a tanh soft cap, or log-softmax."""
    n = Namer(rng)
    kind = rng.choice(["temperature", "masked", "softcap", "log"])
    s, rows, cols = n.pick("scores", "logits", "z"), n.pick("rows", "n"), n.pick("cols", "vocab", "keys")
    f = n.pick("zf", "s32", "logits_f")
    lines = [f"{f} = {s}.astype(jnp.float32)"]
    params, statics, extra = [s], {}, ""
    if kind == "temperature":
        lines.append(f"{f} = {f} / temperature")
        statics["temperature"] = rng.choice([0.7, 1.3, 2.0])
    elif kind == "softcap":
        lines.append(f"{f} = cap * jnp.tanh({f} / cap)")
        statics["cap"] = rng.choice([30.0, 50.0])
    elif kind == "masked":
        params.append("valid")
        extra = f"valid = jax.random.uniform(k2, ({rows}, {cols})) > 0.2"
        lines.append(f"{f} = jnp.where(valid, {f}, {rng.choice(['-1e9', '-jnp.inf', 'jnp.finfo(jnp.float32).min'])})")
    if kind == "log":
        lines.append(n.pick(f"out = jax.nn.log_softmax({f}, axis=-1)",
                            f"out = {f} - jax.scipy.special.logsumexp({f}, axis=-1, keepdims=True)"))
    elif n.flag():
        lines.append(f"out = jax.nn.softmax({f}, axis=-1)")
    else:
        lines += [f"{f} = {f} - jnp.max({f}, axis=-1, keepdims=True)", f"e = jnp.exp({f})",
                  "out = e / jnp.sum(e, axis=-1, keepdims=True)"]
    lines.append(f"return out.astype({s}.dtype)")
    kw = (", *, " + ", ".join(statics)) if statics else ""
    src = code(f'''
        """Softmax over the last axis ({kind})."""

        import jax
        import jax.numpy as jnp


        def get_inputs(key, *, {rows}, {cols}):
            k1, k2 = jax.random.split(key)
            {s} = (4.0 * jax.random.normal(k1, ({rows}, {cols}), jnp.float32)).astype({JNP_DTYPE[dtype]})
            {extra}
            return ({", ".join(params)},), {statics!r}


        def reference({", ".join(params)}{kw}):
        {indent(lines)}
    ''')
    cpu = {rows: 256, cols: 16384} if decode else {rows: 2048, cols: 2048}
    full = {rows: 128, cols: 128256} if decode else {rows: 32768, cols: 8192}
    return Draft("softmax", f"Softmax_{kind}", "reduction", f"softmax variant '{kind}' over the last axis, f32 statistics.",
                 dtype, decode, src, {"cpu": cpu, "full": full}, {rows: {}}, ["softmax", kind])


def attention_prefill(rng: random.Random, dtype: str, decode: bool) -> Draft:
    """Multi-head or grouped-query attention over a whole sequence: causal, sliding-window, biased or full."""
    del decode  # prefill is never decode-shaped
    n = Namer(rng)
    bf16 = dtype == "bfloat16"
    mask = rng.choice(["causal", "window", "bias", "none"])
    gqa = n.flag(0.6)
    bhsd = n.flag()  # [batch, heads, seq, dim] or [batch, seq, heads, dim]
    q, k, v = n.pick("q", "query", "xq"), n.pick("k", "key", "xk"), n.pick("v", "value", "xv")
    lay = "bhsd" if bhsd else "bshd"
    qs, ks = ("bhqd", "bhkd") if bhsd else ("bqhd", "bkhd")
    lines = []
    if gqa:
        axis = 1 if bhsd else 2
        lines += [f"rep = {q}.shape[{axis}] // {k}.shape[{axis}]",
                  f"{k} = jnp.repeat({k}, rep, axis={axis})", f"{v} = jnp.repeat({v}, rep, axis={axis})"]
    lines.append(f"s = jnp.einsum(\"{qs},{ks}->bhqk\", {q}, {k}{', preferred_element_type=jnp.float32' if bf16 else ''})")
    lines.append(n.pick(f"s = s * ({q}.shape[-1] ** -0.5)", f"s = s / jnp.sqrt(jnp.float32({q}.shape[-1]))"))
    params = [q, k, v]
    statics: dict[str, object] = {}
    if mask in ("causal", "window"):
        lines += ["L = s.shape[-1]", "i = jnp.arange(L)[:, None]", "j = jnp.arange(L)[None, :]"]
        cond = "j <= i" if mask == "causal" else "(j <= i) & (i - j < window)"
        lines.append(f"s = jnp.where({cond}, s, -1e30)")
        if mask == "window":
            statics["window"] = 256
    elif mask == "bias":
        params.append("attn_bias")
        lines.append("s = s + attn_bias.astype(jnp.float32)")
    lines.append("p = jax.nn.softmax(s.astype(jnp.float32), axis=-1)")
    out_sub = "bhqd" if bhsd else "bqhd"
    vs = "bhkd" if bhsd else "bkhd"
    lines.append(f"o = jnp.einsum(\"bhqk,{vs}->{out_sub}\", p.astype({v}.dtype), {v}"
                 f"{', preferred_element_type=jnp.float32' if bf16 else ''})")
    lines.append(f"return o.astype({q}.dtype)")
    dt = JNP_DTYPE[dtype]
    qshape = "(batch, heads, seq, head_dim)" if bhsd else "(batch, seq, heads, head_dim)"
    kvshape = "(batch, kv_heads, seq, head_dim)" if bhsd else "(batch, seq, kv_heads, head_dim)"
    bias_line = ("attn_bias = jax.random.normal(ks[3], (heads, seq, seq), jnp.float32).astype(" + dt + ")"
                 if mask == "bias" else "")
    kw = (", *, " + ", ".join(statics)) if statics else ""
    src = code(f'''
        """Attention ({mask} mask{', grouped-query' if gqa else ''}), layout {lay}."""

        import jax
        import jax.numpy as jnp


        def get_inputs(key, *, batch, heads, kv_heads, seq, head_dim):
            ks = jax.random.split(key, 4)
            {q} = jax.random.normal(ks[0], {qshape}, jnp.float32).astype({dt})
            {k} = jax.random.normal(ks[1], {kvshape}, jnp.float32).astype({dt})
            {v} = jax.random.normal(ks[2], {kvshape}, jnp.float32).astype({dt})
            {bias_line}
            return ({", ".join(params)},), {statics!r}


        def reference({", ".join(params)}{kw}):
        {indent(lines)}
    ''')
    kvh = 2 if gqa else 8
    cpu = {"batch": 1, "heads": 8, "kv_heads": kvh, "seq": 512, "head_dim": 64}
    full = {"batch": 4, "heads": 32, "kv_heads": 8 if gqa else 32, "seq": 4096, "head_dim": 128}
    if mask == "bias":
        full["batch"] = 1
    return Draft("attention_prefill", f"Attention_{mask}{'_GQA' if gqa else ''}", "attention",
                 f"softmax(q k^T / sqrt(d) with a {mask} mask) v, layout {lay}"
                 f"{', kv heads shared by groups of query heads' if gqa else ''}.",
                 dtype, False, src, {"cpu": cpu, "full": full}, {"batch": {}},
                 ["attention", mask] + (["gqa"] if gqa else []))


def attention_decode(rng: random.Random, dtype: str, decode: bool) -> Draft:
    """One query token per sequence over a KV cache with per-sequence lengths (GQA, optional sliding window)."""
    n = Namer(rng)
    bf16 = dtype == "bfloat16"
    window = n.flag(0.3)
    q, kc, vc, ln = n.pick("q", "query"), n.pick("k_cache", "keys"), n.pick("v_cache", "values"), n.pick("lengths", "seq_lens", "kv_len")
    lines = [f"b, hq, d = {q}.shape", f"hkv = {kc}.shape[1]",
             f"qg = {q}.reshape(b, hkv, hq // hkv, d)",
             f"s = jnp.einsum(\"bgrd,bgtd->bgrt\", qg, {kc}{', preferred_element_type=jnp.float32' if bf16 else ''})",
             "s = s * scale", f"pos = jnp.arange({kc}.shape[2])[None, :]", f"ok = pos < {ln}[:, None]"]
    if window:
        lines.append(f"ok = ok & (pos >= {ln}[:, None] - window)")
    lines += ["s = jnp.where(ok[:, None, None, :], s, -jnp.inf)", "w = jax.nn.softmax(s.astype(jnp.float32), axis=-1)",
              f"o = jnp.einsum(\"bgrt,bgtd->bgrd\", w.astype({vc}.dtype), {vc}"
              f"{', preferred_element_type=jnp.float32' if bf16 else ''})",
              f"return o.reshape(b, hq, d).astype({q}.dtype)"]
    statics = "{\"scale\": head_dim ** -0.5" + (", \"window\": 1024}" if window else "}")
    dt = JNP_DTYPE[dtype]
    src = code(f'''
        """Decode attention: one query token per sequence, grouped-query, over a cache of which the first
        {ln}[b] positions are valid{' (and only the last window of them are attended)' if window else ''}."""

        import jax
        import jax.numpy as jnp


        def get_inputs(key, *, batch, q_heads, kv_heads, max_len, head_dim):
            k1, k2, k3, k4 = jax.random.split(key, 4)
            {q} = jax.random.normal(k1, (batch, q_heads, head_dim), jnp.float32).astype({dt})
            {kc} = jax.random.normal(k2, (batch, kv_heads, max_len, head_dim), jnp.float32).astype({dt})
            {vc} = jax.random.normal(k3, (batch, kv_heads, max_len, head_dim), jnp.float32).astype({dt})
            {ln} = jax.random.randint(k4, (batch,), 1, max_len + 1, dtype=jnp.int32)
            return ({q}, {kc}, {vc}, {ln}), {statics}


        def reference({q}, {kc}, {vc}, {ln}, *, scale{', window' if window else ''}):
        {indent(lines)}
    ''')
    cpu = {"batch": 8, "q_heads": 64, "kv_heads": 4, "max_len": 1024, "head_dim": 128}
    full = {"batch": 64, "q_heads": 32, "kv_heads": 8, "max_len": 8192, "head_dim": 128}
    return Draft("attention_decode", f"Decode_Attention{'_Window' if window else ''}", "attention",
                 "one query token per sequence against a contiguous KV cache with per-sequence lengths; "
                 "query heads grouped over kv heads.", dtype, True, src, {"cpu": cpu, "full": full},
                 {"batch": {}}, ["attention", "decode", "gqa"] + (["window"] if window else []))


def gated_mlp(rng: random.Random, dtype: str, decode: bool) -> Draft:
    """A gated MLP (SwiGLU or GeGLU): act(x w_gate) * (x w_up), then the down projection."""
    n = Namer(rng)
    bf16 = dtype == "bfloat16"
    act = rng.choice(["silu", "gelu_tanh"])
    fused = n.flag(0.4)
    x = n.pick("x", "h", "tokens_in")
    acc = ", preferred_element_type=jnp.float32" if bf16 else ""
    if fused:
        params = [x, "w_gate_up", "w_down"]
        lines = [f"gu = jnp.dot({x}, w_gate_up{acc})", "gate, up = jnp.split(gu, 2, axis=-1)"]
    else:
        params = [x, "w_gate", "w_up", "w_down"]
        lines = [f"gate = jnp.dot({x}, w_gate{acc})", f"up = jnp.dot({x}, w_up{acc})"]
    lines += ["a = " + blocks.activation(n, act, "gate") + " * up"]
    lines.append(f"return jnp.dot(a.astype({x}.dtype), w_down{acc}).astype({x}.dtype)" if bf16
                 else f"return a @ w_down")
    dt = JNP_DTYPE[dtype]
    if fused:
        wdraw = f"w_gate_up = (jax.random.normal(ks[1], (d_model, 2 * d_ff), jnp.float32) / d_model ** 0.5).astype({dt})"
    else:
        wdraw = (f"w_gate = (jax.random.normal(ks[1], (d_model, d_ff), jnp.float32) / d_model ** 0.5).astype({dt})\n"
                 f"            w_up = (jax.random.normal(ks[3], (d_model, d_ff), jnp.float32) / d_model ** 0.5).astype({dt})")
    src = code(f'''
        """{'SwiGLU' if act == 'silu' else 'GeGLU'} feed-forward block{' with one fused gate/up weight' if fused else ''}."""

        import jax
        import jax.numpy as jnp


        def get_inputs(key, *, tokens, d_model, d_ff):
            ks = jax.random.split(key, 4)
            {x} = jax.random.normal(ks[0], (tokens, d_model), jnp.float32).astype({dt})
            {wdraw}
            w_down = (jax.random.normal(ks[2], (d_ff, d_model), jnp.float32) / d_ff ** 0.5).astype({dt})
            return ({", ".join(params)},), {{}}


        def reference({", ".join(params)}):
        {indent(lines)}
    ''')
    cpu = {"tokens": 64, "d_model": 1024, "d_ff": 1536} if decode else {"tokens": 256, "d_model": 512, "d_ff": 2048}
    full = ({"tokens": 64, "d_model": 4096, "d_ff": 14336} if decode
            else {"tokens": 8192, "d_model": 4096, "d_ff": 14336})
    return Draft("gated_mlp", "SwiGLU_MLP" if act == "silu" else "GeGLU_MLP", "matmul",
                 f"({act}(x @ w_gate) * (x @ w_up)) @ w_down{' (gate and up fused in one weight)' if fused else ''}.",
                 dtype, decode, src, {"cpu": cpu, "full": full}, {"tokens": {}}, ["gated_mlp", act])


def quant_gemm(rng: random.Random, dtype: str, decode: bool) -> Draft:
    """A weight-only int8 matmul: per-output-channel scales, or per-group scales along the input dimension."""
    n = Namer(rng)
    group = n.flag()
    x, wq, sc = n.pick("x", "a", "activations"), n.pick("w_int8", "qweight", "wq"), n.pick("scales", "w_scale", "s")
    dt = JNP_DTYPE[dtype]
    if group:
        lines = [f"k, n = {wq}.shape", f"w = {wq}.astype(jnp.float32).reshape(k // group, group, n)",
                 f"w = (w * {sc}.astype(jnp.float32)[:, None, :]).reshape(k, n)",
                 f"y = jnp.dot({x}.astype(jnp.float32), w)"]
        sdraw = f"{sc} = (0.002 + 0.001 * jax.random.uniform(k3, (d_in // group, d_out))).astype({dt})"
    else:
        lines = [f"y = jnp.dot({x}, {wq}.astype({x}.dtype){', preferred_element_type=jnp.float32' if dtype == 'bfloat16' else ''})",
                 f"y = y * {sc}.astype(jnp.float32)"]
        sdraw = f"{sc} = (0.002 + 0.001 * jax.random.uniform(k3, (d_out,))).astype({dt})"
    lines.append(f"return y.astype({x}.dtype)")
    statics = "{\"group\": group}" if group else "{}"
    src = code(f'''
        """Weight-only int8 linear layer, {'per-group' if group else 'per-channel'} scales."""

        import jax
        import jax.numpy as jnp


        def get_inputs(key, *, tokens, d_in, d_out{', group' if group else ''}):
            k1, k2, k3 = jax.random.split(key, 3)
            {x} = jax.random.normal(k1, (tokens, d_in), jnp.float32).astype({dt})
            {wq} = jax.random.randint(k2, (d_in, d_out), -127, 128, dtype=jnp.int32).astype(jnp.int8)
            {sdraw}
            return ({x}, {wq}, {sc}), {statics}


        def reference({x}, {wq}, {sc}{', *, group' if group else ''}):
        {indent(lines)}
    ''')
    g = {"group": 128} if group else {}
    cpu = ({"tokens": 64, "d_in": 2048, "d_out": 2048} if decode else {"tokens": 256, "d_in": 1024, "d_out": 2048}) | g
    full = ({"tokens": 32, "d_in": 4096, "d_out": 14336} if decode else {"tokens": 4096, "d_in": 4096, "d_out": 14336}) | g
    return Draft("quant_gemm", f"Int8_GEMM_{'per_group' if group else 'per_channel'}", "matmul",
                 f"x @ dequant(int8 weight, {'per-group (128 along d_in)' if group else 'per-output-channel'} scales).",
                 dtype, decode, src, {"cpu": cpu, "full": full}, {"tokens": {}},
                 ["int8", "per_group" if group else "per_channel", "matmul"])


def conv(rng: random.Random, dtype: str, decode: bool) -> Draft:
    """A convolution of current models: Mamba's causal depthwise conv1d with SiLU, or a strided conv1d stem."""
    del decode
    n = Namer(rng)
    kind = rng.choice(["causal_depthwise", "strided"])
    x, w = n.pick("x", "u", "seq_in"), n.pick("conv_w", "kernel", "w")
    dt = JNP_DTYPE[dtype]
    if kind == "causal_depthwise":
        if n.flag():
            lines = [f"width = {w}.shape[0]", f"xp = jnp.pad({x}, ((0, 0), (width - 1, 0), (0, 0)))",
                     f"y = sum(xp[:, i:i + {x}.shape[1], :] * {w}[i] for i in range(width))"]
        else:
            lines = [f"y = jax.lax.conv_general_dilated({x}, {w}[:, None, :], window_strides=(1,),",
                     f"                                 padding=[({w}.shape[0] - 1, 0)],",
                     "                                 dimension_numbers=(\"NWC\", \"WIO\", \"NWC\"),",
                     f"                                 feature_group_count={x}.shape[-1])"]
        lines += ["y = y + bias", "return jax.nn.silu(y.astype(jnp.float32)).astype(" + x + ".dtype)"]
        wshape, params, bias = f"(width, channels)", [x, w, "bias"], "(channels,)"
        out_shape = "length"
        statics = "{}"
        desc = "causal depthwise conv1d (kernel width 4) + bias + SiLU over [batch, length, channels]"
    else:
        lines = [f"y = jax.lax.conv_general_dilated({x}, {w}, window_strides=(stride,), padding=\"SAME\",",
                 "                                 dimension_numbers=(\"NWC\", \"WIO\", \"NWC\"))",
                 "y = y + bias", "return " + blocks.activation(n, "gelu_erf", "y")]
        wshape, params, bias = "(width, channels, channels)", [x, w, "bias"], "(channels,)"
        statics = "{\"stride\": 2}"
        desc = "strided (2) conv1d, kernel width 3, channels to channels, + bias + GELU over [batch, length, channels]"
    width = 4 if kind == "causal_depthwise" else 3
    src = code(f'''
        """{desc}."""

        import jax
        import jax.numpy as jnp


        def get_inputs(key, *, batch, length, channels, width):
            k1, k2, k3 = jax.random.split(key, 3)
            {x} = jax.random.normal(k1, (batch, length, channels), jnp.float32).astype({dt})
            {w} = (jax.random.normal(k2, {wshape}, jnp.float32) * 0.3).astype({dt})
            bias = (0.1 * jax.random.normal(k3, {bias}, jnp.float32)).astype({dt})
            return ({", ".join(params)},), {statics}


        def reference({", ".join(params)}{', *, stride' if kind == 'strided' else ''}):
        {indent(lines)}
    ''')
    if kind == "causal_depthwise":
        cpu = {"batch": 4, "length": 2048, "channels": 512, "width": width}
        full = {"batch": 8, "length": 8192, "channels": 5120, "width": width}
    else:
        cpu = {"batch": 4, "length": 2048, "channels": 256, "width": width}
        full = {"batch": 16, "length": 16000, "channels": 512, "width": width}
    return Draft("conv", f"Conv1D_{kind}", "conv", desc + ".", dtype, False, src, {"cpu": cpu, "full": full},
                 {"batch": {}}, ["conv", kind])


def scan(rng: random.Random, dtype: str, decode: bool) -> Draft:
    """A linear recurrence: a gated diagonal scan over a sequence, or one decode step of an SSM state."""
    n = Namer(rng)
    dt = JNP_DTYPE[dtype]
    if decode:
        h, x, dtv, A, B, C = n.pick("state", "h", "ssm_state"), n.pick("x", "xt"), "dt", "A", n.pick("B", "b_in"), n.pick("C", "c_out")
        lines = [f"decay = jnp.exp(jax.nn.softplus({dtv}) * {A})",
                 f"upd = (jax.nn.softplus({dtv})[..., None] * {x}.astype(jnp.float32))[..., None] * {B}.astype(jnp.float32)[:, None, None, :]",
                 f"new = {h} * decay[:, :, None, None] + upd",
                 f"y = jnp.einsum(\"bhpn,bn->bhp\", new, {C}.astype(jnp.float32)) + D[None, :, None] * {x}.astype(jnp.float32)",
                 f"return y.astype({x}.dtype), new"]
        params = [h, x, dtv, A, B, C, "D"]
        src = code(f'''
            """One decode step of a Mamba-2 style SSM: state update and readout for every sequence of the batch."""

            import jax
            import jax.numpy as jnp


            def get_inputs(key, *, batch, heads, head_dim, d_state):
                ks = jax.random.split(key, 7)
                {h} = jax.random.normal(ks[0], (batch, heads, head_dim, d_state), jnp.float32)
                {x} = jax.random.normal(ks[1], (batch, heads, head_dim), jnp.float32).astype({dt})
                {dtv} = jax.random.normal(ks[2], (batch, heads), jnp.float32) - 1.0
                {A} = -jnp.exp(0.5 * jax.random.normal(ks[3], (heads,), jnp.float32))
                {B} = jax.random.normal(ks[4], (batch, d_state), jnp.float32).astype({dt})
                {C} = jax.random.normal(ks[5], (batch, d_state), jnp.float32).astype({dt})
                D = jax.random.normal(ks[6], (heads,), jnp.float32)
                return ({", ".join(params)},), {{}}


            def reference({", ".join(params)}):
            {indent(lines, base=12)}
        ''')
        cpu = {"batch": 32, "heads": 32, "head_dim": 64, "d_state": 128}
        full = {"batch": 128, "heads": 80, "head_dim": 64, "d_state": 128}
        return Draft("scan", "SSM_Decode_Step", "recurrence",
                     "h' = exp(softplus(dt) A) h + softplus(dt) x B; y = h' C + D x; returns (y, h').", dtype, True,
                     src, {"cpu": cpu, "full": full}, {"batch": {}}, ["scan", "decode", "ssm"])
    assoc = n.flag()
    a, x = n.pick("a_gate", "decay_logit", "r"), n.pick("x", "inp", "v")
    lines = [f"a = jax.nn.sigmoid({a}.astype(jnp.float32))", f"b = (1.0 - a) * {x}.astype(jnp.float32)"]
    if assoc:
        lines += ["def combine(left, right):", "    al, bl = left", "    ar, br = right", "    return al * ar, ar * bl + br",
                  "_, h = jax.lax.associative_scan(combine, (a, b), axis=1)"]
    else:
        lines += ["def step(carry, ab):", "    at, bt = ab", "    carry = at * carry + bt", "    return carry, carry",
                  "_, h = jax.lax.scan(step, jnp.zeros_like(b[:, 0]), (jnp.swapaxes(a, 0, 1), jnp.swapaxes(b, 0, 1)))",
                  "h = jnp.swapaxes(h, 0, 1)"]
    lines.append(f"return h.astype({x}.dtype)")
    src = code(f'''
        """Gated linear recurrence h_t = a_t h_(t-1) + (1 - a_t) x_t with a_t = sigmoid(gate), {'associative scan' if assoc else 'sequential scan'}."""

        import jax
        import jax.numpy as jnp


        def get_inputs(key, *, batch, length, width):
            k1, k2 = jax.random.split(key)
            {a} = (jax.random.normal(k1, (batch, length, width), jnp.float32) + 2.0).astype({dt})
            {x} = jax.random.normal(k2, (batch, length, width), jnp.float32).astype({dt})
            return ({a}, {x}), {{}}


        def reference({a}, {x}):
        {indent(lines)}
    ''')
    cpu = {"batch": 4, "length": 1024, "width": 1024} if assoc else {"batch": 4, "length": 1024, "width": 1024}
    full = {"batch": 8, "length": 4096, "width": 2560}
    return Draft("scan", "Gated_Linear_Recurrence", "recurrence", "a gated diagonal linear recurrence over the sequence axis.",
                 dtype, False, src, {"cpu": cpu, "full": full}, {"batch": {}}, ["scan", "associative" if assoc else "sequential"])


def topk_routing(rng: random.Random, dtype: str, decode: bool) -> Draft:
    """Mixture-of-experts routing: router logits, top-k experts per token, renormalized dense combine weights."""
    n = Namer(rng)
    sigmoid = n.flag(0.4)  # DeepSeek-V3 style: sigmoid scores, a selection bias, weights from unbiased scores
    x, wr = n.pick("x", "hidden"), n.pick("w_router", "gate_w", "router")
    dt = JNP_DTYPE[dtype]
    lines = [f"logits = jnp.dot({x}.astype(jnp.float32), {wr}.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST)"]
    params = [x, wr]
    if sigmoid:
        params.append("sel_bias")
        lines += ["scores = jax.nn.sigmoid(logits)", "_, idx = jax.lax.top_k(scores + sel_bias, top_k)",
                  "picked = jnp.take_along_axis(scores, idx, axis=-1)"]
    else:
        lines += ["scores = jax.nn.softmax(logits, axis=-1)", "picked, idx = jax.lax.top_k(scores, top_k)"]
    lines += ["picked = picked / jnp.sum(picked, axis=-1, keepdims=True)",
              "dense = jnp.zeros_like(scores).at[jnp.arange(scores.shape[0])[:, None], idx].set(picked)",
              f"return dense.astype({x}.dtype)"]
    src = code(f'''
        """Top-k routing over experts ({'sigmoid scores with a selection bias' if sigmoid else 'softmax scores'}),
        returned as dense renormalized combine weights [tokens, experts]."""

        import jax
        import jax.numpy as jnp


        def get_inputs(key, *, tokens, d_model, experts):
            k1, k2, k3 = jax.random.split(key, 3)
            {x} = jax.random.normal(k1, (tokens, d_model), jnp.float32).astype({dt})
            {wr} = (jax.random.normal(k2, (d_model, experts), jnp.float32) / d_model ** 0.5).astype({dt})
            {"sel_bias = 0.1 * jax.random.normal(k3, (experts,), jnp.float32)" if sigmoid else ""}
            return ({", ".join(params)},), {{"top_k": {rng.choice([2, 4, 8])}}}


        def reference({", ".join(params)}, *, top_k):
        {indent(lines)}
    ''')
    cpu = {"tokens": 4096, "d_model": 1024, "experts": 64} if decode else {"tokens": 8192, "d_model": 512, "experts": 64}
    full = {"tokens": 256, "d_model": 7168, "experts": 256} if decode else {"tokens": 8192, "d_model": 4096, "experts": 64}
    return Draft("topk_routing", "TopK_Router", "moe", "router logits (float32, HIGHEST), top-k experts, renormalized weights.",
                 dtype, decode, src, {"cpu": cpu, "full": full}, {"tokens": {}}, ["router", "top_k"])


def rope(rng: random.Random, dtype: str, decode: bool) -> Draft:
    """Rotary position embedding on queries and keys: rotate-half or interleaved pairs, positions as input."""
    n = Namer(rng)
    half = n.flag()
    q, k, pos = n.pick("q", "xq", "queries"), n.pick("k", "xk", "keys"), n.pick("positions", "pos", "position_ids")
    dt = JNP_DTYPE[dtype]
    lines = [f"d = {q}.shape[-1]", "inv = 1.0 / (theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))",
             f"ang = {pos}.astype(jnp.float32)[..., None] * inv", "cos, sin = jnp.cos(ang), jnp.sin(ang)"]
    if half:
        lines += ["def rot(t):", "    t = t.astype(jnp.float32)", "    t1, t2 = jnp.split(t, 2, axis=-1)",
                  "    c = jnp.concatenate([cos, cos], -1)[..., None, :]", "    s = jnp.concatenate([sin, sin], -1)[..., None, :]",
                  "    return t * c + jnp.concatenate([-t2, t1], -1) * s"]
    else:
        lines += ["def rot(t):", "    t = t.astype(jnp.float32).reshape(*t.shape[:-1], -1, 2)", "    a, b = t[..., 0], t[..., 1]",
                  "    c, s = cos[..., None, :], sin[..., None, :]",
                  "    return jnp.stack([a * c - b * s, a * s + b * c], -1).reshape(*t.shape[:-2], -1)"]
    lines.append(f"return rot({q}).astype({q}.dtype), rot({k}).astype({k}.dtype)")
    if decode:
        shape_q, shape_k, pshape = "(batch, q_heads, head_dim)", "(batch, kv_heads, head_dim)", "(batch,)"
        sig = "batch, q_heads, kv_heads, head_dim"
        cpu = {"batch": 1024, "q_heads": 32, "kv_heads": 8, "head_dim": 128}
        full = {"batch": 256, "q_heads": 64, "kv_heads": 8, "head_dim": 128}
    else:
        shape_q, shape_k, pshape = "(batch, seq, q_heads, head_dim)", "(batch, seq, kv_heads, head_dim)", "(batch, seq)"
        sig = "batch, seq, q_heads, kv_heads, head_dim"
        cpu = {"batch": 2, "seq": 512, "q_heads": 16, "kv_heads": 4, "head_dim": 128}
        full = {"batch": 8, "seq": 8192, "q_heads": 32, "kv_heads": 8, "head_dim": 128}
    src = code(f'''
        """Rotary embedding ({'rotate-half' if half else 'interleaved pairs'}) of queries and keys at given positions{' (one decode token per sequence)' if decode else ''}."""

        import jax
        import jax.numpy as jnp


        def get_inputs(key, *, {sig}):
            k1, k2, k3 = jax.random.split(key, 3)
            {q} = jax.random.normal(k1, {shape_q}, jnp.float32).astype({dt})
            {k} = jax.random.normal(k2, {shape_k}, jnp.float32).astype({dt})
            {pos} = jax.random.randint(k3, {pshape}, 0, 32768, dtype=jnp.int32)
            return ({q}, {k}, {pos}), {{"theta": {rng.choice(["10000.0", "500000.0"])}}}


        def reference({q}, {k}, {pos}, *, theta):
        {indent(lines)}
    ''')
    return Draft("rope", f"RoPE_{'rotate_half' if half else 'interleaved'}", "elementwise",
                 "rotary position embedding of q and k; angles from positions and theta in float32.", dtype, decode, src,
                 {"cpu": cpu, "full": full}, {"batch": {}}, ["rope", "rotate_half" if half else "interleaved"])


def loss(rng: random.Random, dtype: str, decode: bool) -> Draft:
    """Token cross-entropy from logits: mean over tokens with an ignore mask, optional z-loss or label smoothing."""
    del decode
    n = Namer(rng)
    extra = rng.choice(["zloss", "smoothing", "plain"])
    lg, lab = n.pick("logits", "scores", "lm_logits"), n.pick("labels", "targets", "tgt")
    dt = JNP_DTYPE[dtype]
    lines = [f"z = {lg}.astype(jnp.float32)", "lse = jax.nn.logsumexp(z, axis=-1)",
             f"valid = {lab} >= 0", f"safe = jnp.where(valid, {lab}, 0)",
             "picked = jnp.take_along_axis(z, safe[:, None], axis=-1)[:, 0]", "nll = lse - picked"]
    statics = "{}"
    if extra == "smoothing":
        lines.append("nll = (1.0 - eps) * nll + eps * (lse - jnp.mean(z, axis=-1))")
        statics = "{\"eps\": 0.1}"
    elif extra == "zloss":
        lines.append("nll = nll + z_weight * jnp.square(lse)")
        statics = "{\"z_weight\": 1e-4}"
    lines += ["per_token = jnp.where(valid, nll, 0.0)",
              "mean = jnp.sum(per_token) / jnp.maximum(jnp.sum(valid), 1)",
              f"return per_token.astype({lg}.dtype), mean"]
    kw = {"smoothing": ", *, eps", "zloss": ", *, z_weight", "plain": ""}[extra]
    src = code(f'''
        """Token cross-entropy over non-ignored labels (-1 = ignore): per-token losses and their float32 mean{', with label smoothing' if extra == 'smoothing' else ', with z-loss' if extra == 'zloss' else ''}."""

        import jax
        import jax.numpy as jnp


        def get_inputs(key, *, tokens, vocab):
            k1, k2 = jax.random.split(key)
            {lg} = (3.0 * jax.random.normal(k1, (tokens, vocab), jnp.float32)).astype({dt})
            {lab} = jax.random.randint(k2, (tokens,), -1, vocab, dtype=jnp.int32)
            return ({lg}, {lab}), {statics}


        def reference({lg}, {lab}{kw}):
        {indent(lines)}
    ''')
    cpu = {"tokens": 1024, "vocab": 8192}
    full = {"tokens": 8192, "vocab": 128256}
    return Draft("loss", f"CrossEntropy_{extra}", "reduction", "per-token cross-entropy from logits with an ignore index (in the logits' dtype) and its float32 mean.",
                 dtype, False, src, {"cpu": cpu, "full": full}, {"tokens": {}}, ["cross_entropy", extra])


FAMILIES: dict[str, Family] = {
    "projection": projection, "norm_projection": norm_projection, "norm": norm, "softmax": softmax,
    "attention_prefill": attention_prefill, "attention_decode": attention_decode, "gated_mlp": gated_mlp,
    "quant_gemm": quant_gemm, "conv": conv, "scan": scan, "topk_routing": topk_routing, "rope": rope, "loss": loss,
}
