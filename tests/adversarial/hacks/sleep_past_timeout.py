# hack: spin on the device far past the wall-clock limit
# task: 12p_RMSNorm
# expect: timeout
import jax
import jax.numpy as jnp


def kernel(x, weight, *, eps):
    def body(carry):
        i, acc = carry
        return i + 1, acc * 1.0000001

    _, acc = jax.lax.while_loop(lambda c: c[0] < 2_000_000_000, body, (jnp.int32(0), x))
    return acc
