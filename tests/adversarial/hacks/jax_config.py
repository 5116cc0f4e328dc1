# hack: lower JAX's matmul precision for every later candidate in the worker
# task: 41k_Gemm_Add_ReLU
# expect: rejected | monkey-patching
import jax
import jax.numpy as jnp

jax.config.update("jax_default_matmul_precision", "bfloat16")


def kernel(x, weight, bias):
    return jnp.maximum(x @ weight.T + bias, 0.0)
