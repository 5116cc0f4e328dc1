"""Small pieces of source the families share: activations, norms and how a matmul is spelled.

Each returns source text for one expression or helper, chosen from several ways people write it.
"""

from __future__ import annotations

from jaxbench.generate.draft import Namer

ACTIVATIONS = ("gelu_tanh", "gelu_erf", "silu", "relu2", "tanh_clamp")


def activation(n: Namer, kind: str, v: str) -> str:
    """An expression applying activation ``kind`` to the variable ``v``."""
    if kind == "gelu_tanh":
        return n.pick(f"jax.nn.gelu({v}, approximate=True)",
                      f"0.5 * {v} * (1.0 + jnp.tanh(0.7978845608 * ({v} + 0.044715 * {v} ** 3)))")
    if kind == "gelu_erf":
        return n.pick(f"jax.nn.gelu({v}, approximate=False)",
                      f"0.5 * {v} * (1.0 + jax.lax.erf({v} / jnp.sqrt(2.0).astype({v}.dtype)))")
    if kind == "silu":
        return n.pick(f"jax.nn.silu({v})", f"{v} * jax.nn.sigmoid({v})", f"{v} / (1.0 + jnp.exp(-{v}))")
    if kind == "relu2":
        return n.pick(f"jnp.square(jax.nn.relu({v}))", f"jnp.maximum({v}, 0.0) ** 2")
    if kind == "tanh_clamp":
        return f"jnp.clip(jnp.tanh({v}) * 1.7, -1.5, 1.5)"
    raise ValueError(kind)


def matmul(n: Namer, a: str, b: str, a_sub: str, b_sub: str, out_sub: str, acc: bool) -> str:
    """``a`` times ``b`` as ``@``, einsum or dot (with float32 accumulation for bfloat16 operands if ``acc``)."""
    pref = ", preferred_element_type=jnp.float32" if acc else ""
    style = n.rng.choice(["at", "einsum", "einsum"] if not acc else ["einsum", "dot"])
    if style == "at":
        return f"{a} @ {b}"
    if style == "dot" and len(a_sub) == 2 and len(b_sub) == 2 and a_sub[1] == b_sub[0]:
        return f"jnp.dot({a}, {b}{pref})"
    return f"jnp.einsum(\"{a_sub},{b_sub}->{out_sub}\", {a}, {b}{pref})"


def rms_norm_lines(n: Namer, x: str, w: str, eps: str, out: str, f32: bool) -> list[str]:
    """Lines computing RMSNorm of ``x`` scaled by ``w`` into ``out`` (statistics in float32 if ``f32``)."""
    xf = f"{x}.astype(jnp.float32)" if f32 else x
    var = n.pick("ms", "variance", "mean_sq", "sq_mean")
    if n.flag():
        lines = [f"{var} = jnp.mean(jnp.square({xf}), axis=-1, keepdims=True)",
                 f"{out} = {xf} * jax.lax.rsqrt({var} + {eps})"]
    else:
        lines = [f"{var} = ({xf} * {xf}).mean(-1, keepdims=True)",
                 f"{out} = {xf} / jnp.sqrt({var} + {eps})"]
    if f32:
        lines.append(f"{out} = ({out} * {w}.astype(jnp.float32)).astype({x}.dtype)")
    else:
        lines.append(f"{out} = {out} * {w}")
    return lines


def layer_norm_lines(n: Namer, x: str, g: str, b: str, eps: str, out: str, f32: bool) -> list[str]:
    """Lines computing LayerNorm of ``x`` with gain ``g`` and bias ``b`` into ``out``."""
    xf = f"{x}.astype(jnp.float32)" if f32 else x
    mu, var = n.pick("mu", "mean", "avg"), n.pick("var", "sigma2", "variance")
    lines = [f"{mu} = jnp.mean({xf}, axis=-1, keepdims=True)"]
    if n.flag():
        lines.append(f"{var} = jnp.var({xf}, axis=-1, keepdims=True)")
    else:
        lines.append(f"{var} = jnp.mean(jnp.square({xf} - {mu}), axis=-1, keepdims=True)")
    lines.append(f"{out} = ({xf} - {mu}) * jax.lax.rsqrt({var} + {eps})")
    if f32:
        lines.append(f"{out} = ({out} * {g}.astype(jnp.float32) + {b}.astype(jnp.float32)).astype({x}.dtype)")
    else:
        lines.append(f"{out} = {out} * {g} + {b}")
    return lines


def indent(lines: list[str], base: int = 8, extra: int = 4) -> str:
    """``lines`` for a placeholder that sits at column ``base`` of a template, each ``extra`` deeper."""
    return " " * extra + ("\n" + " " * (base + extra)).join(lines)
