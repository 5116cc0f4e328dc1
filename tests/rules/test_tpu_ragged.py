"""The ragged paged attention template: roles from the shapes, confirmed against the computation; correct in
TPU interpret mode at the cpu size; lowering for v6e at full size."""

from __future__ import annotations

import pytest
import types

import jax
import numpy as np
from jax.experimental.pallas import tpu as pltpu

from jaxbench.task import load_task
from maxkernel.targets import validate_tpu
from maxkernel.templates.tpu_ragged import TPU_RAGGED_PAGED, analyse

TASK = "7p_Ragged_Paged_Attention"


def test_it_applies_to_ragged_paged_attention_only() -> None:
    task = load_task(TASK)
    found = analyse(task, "full")
    assert not isinstance(found, str)
    assert (found.seqs, found.group, found.page_size, found.pages_per_seq) == (32, 4, 16, 256)
    assert found.q_block == 448 and found.name("cu_q_lens") == "cu_q_lens"
    assert isinstance(TPU_RAGGED_PAGED.applies(load_task("6p_Paged_Attention"), None), str)  # one token a sequence
    assert isinstance(TPU_RAGGED_PAGED.applies(load_task("1p_Flash_Attention"), None), str)
    space = TPU_RAGGED_PAGED.space(task, None, "tpu-v6e")
    assert space.defaults == {"pages_per_block": 8} and all(256 % p == 0 for p in space.space["pages_per_block"])
    assert TPU_RAGGED_PAGED.space(task, None, "cpu").space["pages_per_block"] == []  # manual DMAs: TPU only


@pytest.mark.slow
def test_the_kernel_matches_the_reference_in_tpu_interpret_mode() -> None:
    task = load_task(TASK)
    source = TPU_RAGGED_PAGED.render(task, {"pages_per_block": 8}, ("cpu",))
    assert "pl.Element(q_block)" in source and "make_async_copy(hbm.at[index, :, h]" in source
    module = types.ModuleType("candidate")
    exec(compile(source, "candidate.py", "exec"), module.__dict__)
    args, static = task.get_inputs(jax.random.key(3), "cpu")
    expected = np.asarray(task.reference(*args, **static), np.float32)
    with pltpu.force_tpu_interpret_mode():
        got = np.asarray(module.kernel(*args, **static), np.float32)
    # Tolerance 1e-2 + 1e-2 |reference|: decodes, prefill chunks and two kv blocks a sequence all checked.
    assert got.shape == expected.shape
    assert np.max(np.abs(got - expected) / (1e-2 + 1e-2 * np.abs(expected))) < 1.0


def test_the_default_lowers_for_v6e_at_full_size() -> None:
    task = load_task(TASK)
    space = TPU_RAGGED_PAGED.space(task, None, "tpu-v6e")
    result = validate_tpu(TPU_RAGGED_PAGED.render(task, space.defaults, ("cpu", "full")), task, "v6e")
    assert result.ok, result.reason
    assert result.vmem_bytes is not None and result.vmem_bytes <= result.vmem_budget_bytes


@pytest.mark.slow
def test_query_and_kv_heads_are_halved_together_for_a_cheaper_check(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Halving the query heads or the kv heads alone changes the kernel's query block (the group folded into
    its rows); halved together they keep it, and the check runs a quarter of the interpreted operations."""
    import maxkernel.targets.check_size as check_size
    from maxkernel.targets.loader import load_candidate
    from maxkernel.targets.specs import load_tpu_spec

    task = load_task(TASK)
    space = TPU_RAGGED_PAGED.space(task, None, "tpu-v6e")
    source = TPU_RAGGED_PAGED.render(task, space.defaults, ("cpu", "full"))
    together = check_size.derive_check_size(load_candidate(source), task, load_tpu_spec("v6e"), True)
    monkeypatch.setattr(check_size, "JOINT_HALVING_S", float("inf"))
    alone = check_size.derive_check_size(load_candidate(source), task, load_tpu_spec("v6e"), True)
    assert (alone.values["num_q_heads"], alone.values["num_kv_heads"]) == (32, 8)
    assert (together.values["num_q_heads"], together.values["num_kv_heads"]) == (8, 2)
    assert together.refusal is None and together.interpreted_ops * 4 <= alone.interpreted_ops
    assert {k: v for k, v in together.values.items() if "heads" not in k} == \
        {k: v for k, v in alone.values.items() if "heads" not in k}
