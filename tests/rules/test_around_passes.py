"""The reference's float32 products around a kernel, run by XLA, as precise as the task needs: a product of
values exact in bfloat16 keeps one pass (it is exact), any other becomes bfloat16 products of its operands'
high and low parts (two beside a widened weight), or of three parts where three passes are not enough."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxbench.tpu_numerics import computed_as_on_tpu
from maxkernel.analysis.program import ProgramBuilder, run_program
from maxkernel.templates.around import with_passes


def _layer(x, w_down, scale, w_up):  # type: ignore[no-untyped-def]
    """A bf16 activation and weight widened (an exact product), then an RMS-normed latent (not bf16) times a
    widened weight."""
    latent = jnp.dot(x.astype(jnp.float32), w_down.astype(jnp.float32))
    normed = latent * jax.lax.rsqrt(jnp.mean(latent * latent, axis=-1, keepdims=True) + 1e-6) * scale
    return jnp.dot(normed, w_up.T.astype(jnp.float32))


ARGS = (jax.ShapeDtypeStruct((64, 256), jnp.bfloat16), jax.ShapeDtypeStruct((256, 128), jnp.bfloat16),
        jax.ShapeDtypeStruct((128,), jnp.float32), jax.ShapeDtypeStruct((512, 128), jnp.bfloat16))


def _program():  # type: ignore[no-untyped-def]
    return ProgramBuilder().build(jax.make_jaxpr(_layer)(*ARGS), ["x", "w_down", "scale", "w_up"])


def _dots(program):  # type: ignore[no-untyped-def]
    return [(tuple(np.dtype(op.dtype).name for op in n.ins), n.params.get("precision"))
            for n in program.nodes if n.prim == "dot_general"]


def _values():  # type: ignore[no-untyped-def]
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    return [(3.0 + jax.random.normal(k, a.shape, jnp.float32)).astype(a.dtype) for k, a in zip(keys, ARGS)]


def test_the_normed_latent_times_a_widened_weight_takes_two_bf16_passes_and_the_exact_product_one() -> None:
    program = _program()
    split = with_passes(program, 3)
    assert _dots(split) == [(("float32", "float32"), None),  # bf16 x bf16 widened: exact as written
                            (("bfloat16", "bfloat16"), None), (("bfloat16", "bfloat16"), None)]  # hi and lo
    assert _dots(with_passes(program, 6))[1:] == [(("bfloat16", "bfloat16"), None)] * 3  # high, middle, low
    assert _dots(with_passes(program, 1)) == _dots(program)  # the tolerance admits one pass
    assert len(_dots(program)) == 2  # the program itself is left as it was


def test_the_split_product_is_as_precise_as_three_passes_under_tpu_numerics() -> None:
    """Under the evaluator's TPU numerics the reference's own code rounds the latent to bfloat16 (one pass);
    the split product keeps its low part."""
    values = _values()
    exact = np.asarray(jax.jit(_layer)(*values), np.float64)
    program = _program()

    def on_tpu(p):  # type: ignore[no-untyped-def]
        fn = lambda *a: run_program(p, list(a))  # noqa: E731
        on, _ = computed_as_on_tpu(fn, jax.make_jaxpr(fn)(*ARGS), ARGS)
        return np.asarray(on(*values), np.float64)

    error = lambda got: np.abs(got - exact).max() / np.abs(exact).max()  # noqa: E731
    one_pass, split, three_levels = (error(on_tpu(p)) for p in (program, with_passes(program, 3), with_passes(program, 6)))
    # at float32's own rounding of the exact product (the reference computed in float32 on this CPU)
    assert three_levels <= split < 1e-5 and one_pass > 1e-4, (three_levels, split, one_pass)
