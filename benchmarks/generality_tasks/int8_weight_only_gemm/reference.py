"""Weight-only int8 linear layer: int8 weights with one float scale per output channel, bfloat16 activations."""

import jax
import jax.numpy as jnp


def get_inputs(key, *, m, k, n):
    ka, kq, ks = jax.random.split(key, 3)
    act = jax.random.normal(ka, (m, k), jnp.float32).astype(jnp.bfloat16)
    w_int8 = jax.random.randint(kq, (n, k), -127, 128, dtype=jnp.int32).astype(jnp.int8)
    # Per-output-channel scales as a symmetric quantizer would store them (absmax / 127 of a ~N(0, 1/k) weight).
    w_scale = (jax.random.uniform(ks, (n,), jnp.float32, 0.5, 1.5) * 3.0 / (127.0 * k**0.5))
    return (act, w_int8, w_scale), {}


def reference(act, w_int8, w_scale):
    w = w_int8.astype(jnp.bfloat16)
    acc = jax.lax.dot_general(act, w, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
    return (acc * w_scale[None, :]).astype(jnp.bfloat16)
