"""The fingerprint that ties the checked program to the priced one: the same code traced in the pricing
stage (under a one-device abstract TPU mesh) and in the checking worker (interpret mode on) matches;
any change to what is computed (an index map, a constant's value, a kernel body) does not."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from target_kernels import matmul_source

from jaxbench.candidate import load_candidate
from jaxbench.fingerprint import program_fingerprint
from jaxbench.interpret import force_interpret
from jaxbench.task import load_task
from jaxbench.task_check import full_shapes
from maxkernel.targets.device import tpu_device
from maxkernel.targets.specs import load_tpu_spec

EXPERTS = Path(__file__).parents[2] / "benchmarks" / "experts"


def _both(source: str, task_id: str) -> tuple[str, str]:
    """(pricing stage's fingerprint, checking worker's) of one source at the task's cpu size."""
    task = load_task(task_id)
    specs, static, _ = full_shapes(task, "cpu")
    with tpu_device(load_tpu_spec("v5e")):
        priced = jax.jit(partial(load_candidate(source, "a.py").kernel, **static)).trace(*specs).jaxpr
    try:
        force_interpret("tpu")
        checked = jax.make_jaxpr(partial(load_candidate(source, "b.py").kernel, **static))(*specs)
    finally:
        force_interpret("none")
    return program_fingerprint(priced), program_fingerprint(checked)


def test_an_expert_kernel_traces_to_one_fingerprint_in_both_environments() -> None:
    # Ragged dot: shared sub-programs (cumsum) that JAX's printer names differently in the two traces, and
    # reshard equations the abstract mesh adds.
    priced, checked = _both((EXPERTS / "14p_Ragged_Dot.py").read_text(), "14p_Ragged_Dot")
    assert priced == checked


def test_a_branch_on_the_pricing_environment_changes_the_fingerprint() -> None:
    source = matmul_source(128, 128, 256).replace(
        "    m, k = x.shape\n",
        "    m, k = x.shape\n    if not jax.sharding.get_abstract_mesh().empty:\n        x = x * 0\n")
    priced, checked = _both(source, "8p_GEMM")
    assert priced != checked


def _fingerprint(fn, *args) -> str:  # type: ignore[no-untyped-def]
    return program_fingerprint(jax.make_jaxpr(fn)(*args))


def test_index_maps_and_constant_values_are_covered() -> None:
    from jax.experimental import pallas as pl

    def copy(x, shift):  # type: ignore[no-untyped-def]
        return pl.pallas_call(lambda i_ref, o_ref: o_ref.__setitem__(..., i_ref[...]), grid=(2,),
                              in_specs=[pl.BlockSpec((8, 128), lambda i: ((i + shift) % 2, 0))],
                              out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
                              out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=True)(x)

    x = jnp.zeros((16, 128))
    assert _fingerprint(partial(copy, shift=0), x) == _fingerprint(partial(copy, shift=0), x)
    assert _fingerprint(partial(copy, shift=0), x) != _fingerprint(partial(copy, shift=1), x)
    table_a, table_b = jnp.arange(128.0), jnp.arange(128.0).at[5].set(-1.0)
    assert _fingerprint(lambda y: y + table_a, x) != _fingerprint(lambda y: y + table_b, x)


@pytest.mark.parametrize("mode", ["plain", "tpu"])
def test_the_interpret_parameter_is_left_out(mode: str) -> None:
    source = matmul_source(128, 128, 256)
    task = load_task("8p_GEMM")
    specs, static, _ = full_shapes(task, "cpu")
    kernel = partial(load_candidate(source, "c.py").kernel, **static)
    plain = program_fingerprint(jax.make_jaxpr(kernel)(*specs))
    try:
        force_interpret(mode)  # type: ignore[arg-type]
        interpreted = program_fingerprint(jax.make_jaxpr(kernel)(*specs))
    finally:
        force_interpret("none")
    assert plain == interpreted
