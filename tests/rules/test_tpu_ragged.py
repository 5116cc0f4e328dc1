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


SWAPPED = '''
import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location("_ragged", pathlib.Path({path!r}))
_ragged = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_ragged)


def get_inputs(key, **size):
    (q, k_pages, v_pages, kv_lens, page_indices, cu_q_lens), static = _ragged.get_inputs(key, **size)
    return (page_indices, v_pages, cu_q_lens, q, kv_lens, k_pages), {{"eps": 1e-6, **static}}


def reference(table, values, starts, queries, lengths, keys, *, eps, sm_scale, max_q_len):
    """The same attention, the values' pages before the keys' and a float static before the scale."""
    return _ragged.reference(queries, keys, values, lengths, table, starts, sm_scale=sm_scale, max_q_len=max_q_len)
'''


def test_which_pages_hold_the_keys_and_which_float_is_the_scale_are_read_from_values(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Shapes cannot tell the keys' pages from the values', nor the scale from another float static: each
    reading is tried on a cpu-size draw against the attention in float64, and the one that agrees is kept."""
    import yaml

    original = load_task(TASK)
    folder = tmp_path / "ragged_swapped"
    folder.mkdir()
    (folder / "reference.py").write_text(SWAPPED.format(path=str(original.reference_path)))
    spec = yaml.safe_load((original.path / "task.yaml").read_text())
    (folder / "task.yaml").write_text(yaml.safe_dump({**spec, "id": folder.name}))
    found = analyse(load_task(folder), "full")
    assert not isinstance(found, str), found
    assert [found.name(r) for r in ("q", "k_pages", "v_pages", "page_table", "kv_lens", "cu_q_lens", "scale")] == [
        "queries", "keys", "values", "table", "lengths", "starts", "sm_scale"]
    assert found.seqs == 32 and found.group == 4
