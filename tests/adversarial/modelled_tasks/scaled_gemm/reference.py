import jax
import jax.numpy as jnp


def get_inputs(key, *, m, k, n):
    kx, ky = jax.random.split(key)
    x = jax.random.normal(kx, (m, k), jnp.float32).astype(jnp.bfloat16)
    y = jax.random.normal(ky, (k, n), jnp.float32).astype(jnp.bfloat16)
    return (x, y), {"scaling_factor": 1.5}


def reference(x, y, *, scaling_factor):
    return jnp.dot(x, y, preferred_element_type=jnp.float32) * scaling_factor
