# hack: compute an f32 GEMM in bf16 (twice as fast on matrix units) and cast back
# task: 41k_Gemm_Add_ReLU
# expect: incorrect | outside tolerance
import jax.numpy as jnp


def kernel(x, weight, bias):
    y = jnp.matmul(x.astype(jnp.bfloat16), weight.astype(jnp.bfloat16).T, preferred_element_type=jnp.float32)
    return jnp.maximum(y + bias, 0.0).astype(jnp.float32)
