"""The structural signature of a task: primitives (sub-jaxprs inlined), n-grams, shape class."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from jaxbench import load_task
from maxkernel.analysis.signature import SignatureError, TaskSignature, task_signature, trace_signature

F32 = jnp.float32


def _abstract(*shapes: tuple[int, ...]) -> list[jax.ShapeDtypeStruct]:
    return [jax.ShapeDtypeStruct(s, F32) for s in shapes]


def test_jit_and_custom_jvp_bodies_are_inlined() -> None:
    matmul = jax.jit(lambda x, w: x @ w)

    def fn(x, w, b):
        return jax.nn.relu(matmul(x, w) + b)  # relu is a custom_jvp around a jit

    sig = trace_signature(fn, _abstract((8, 16), (16, 4), (4,)))
    assert sig.primitives == ["dot_general", "add", "max"]
    assert "relu" in sig.calls


def test_control_flow_is_kept_and_its_body_walked() -> None:
    def fn(x):
        return jax.lax.fori_loop(0, 3, lambda i, acc: jnp.tanh(acc) * 2.0, x)

    sig = trace_signature(fn, _abstract((4, 4)))
    loop = "scan" if "scan" in sig.primitives else "while"
    assert loop in sig.primitives
    assert sig.primitives.index("tanh") > sig.primitives.index(loop)


def test_ngrams_and_features_describe_the_arithmetic() -> None:
    sig = TaskSignature(task_id="t", category="matmul", primitives=["dot_general", "add", "max", "add", "max"])
    assert sig.ngrams(2) == {"dot_general>add": 1, "add>max": 2, "max>add": 1}
    feats = sig.features()
    assert feats["cat:matmul"] == 2.0
    assert feats["p2:add>max"] > feats["p2:dot_general>add"]  # counted twice
    assert "p3:dot_general>add>max" in feats
    assert sig.pattern == "dot_general>add>max"


def test_task_signature_traces_abstract_inputs_at_cpu_size(task_dir) -> None:
    task = load_task(task_dir("t_gemm_gelu"))
    sig = task_signature(task)
    assert sig.task_id == "t_gemm_gelu" and sig.category == "matmul" and sig.size == "cpu"
    assert [s.shape for s in sig.inputs] == [[64, 128], [128, 128], [128]]
    assert [s.shape for s in sig.outputs] == [[64, 128]]
    assert sig.primitives[:2] == ["dot_general", "add"]
    assert "erfc" in sig.primitives  # exact GELU
    assert sig.shape_class == "2,2,1->2:e3"  # 64*128 elements: 16**3 <= n < 16**4
    assert task_signature(task) == sig  # deterministic
    full = task_signature(task, "full")  # 1024x4096 inputs: shapes only, nothing allocated
    assert full.primitives == sig.primitives and full.shape_class == "2,2,1->2:e5"


def test_suite_task_signature() -> None:
    sig = task_signature(load_task("12p_RMSNorm"))
    assert sig.category == "normalization"
    assert {"rsqrt", "reduce_sum"} <= set(sig.primitives)


def test_untraceable_reference_is_a_signature_error(tmp_path) -> None:
    folder = tmp_path / "t_bad"
    folder.mkdir()
    (folder / "task.yaml").write_text(
        "id: t_bad\nname: t_bad\ncategory: elementwise\ndescription: d\ndtype: float32\n"
        "tolerance: {atol: 1.0e-4, rtol: 0}\nsizes:\n  cpu: {n: 8}\n  full: {n: 16}\n"
    )
    (folder / "reference.py").write_text(
        "import jax, jax.numpy as jnp\n"
        "def get_inputs(key, *, n):\n    return (jax.random.normal(key, (n,)),), {}\n"
        "def reference(x):\n    return x if float(x.sum()) > 0 else -x\n"
    )
    with pytest.raises(SignatureError, match="t_bad: cannot trace the reference"):
        task_signature(load_task(folder))
