# hack: return a bf16 output on an f32 task (silent precision drop)
# task: 41k_Gemm_Add_ReLU
# expect: incorrect | dtype
import jax
import jax.numpy as jnp


def kernel(x, weight, bias):
    y = jnp.matmul(x, weight.T, precision=jax.lax.Precision.HIGHEST)
    return jnp.maximum(y + bias, 0.0).astype(jnp.bfloat16)
