# hack: compute only the first half of the rows, leave the rest as the input
# task: 12p_RMSNorm
# expect: incorrect | outside tolerance
import jax
import jax.numpy as jnp


def kernel(x, weight, *, eps):
    half = x.shape[1] // 2
    head = x[:, :half]
    head = head * jax.lax.rsqrt(jnp.mean(head * head, axis=-1, keepdims=True) + eps) * weight
    return jnp.concatenate([head, x[:, half:]], axis=1)
