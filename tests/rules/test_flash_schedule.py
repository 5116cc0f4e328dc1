"""The flash template's masks and block schedules: recovered formulas and visited blocks, checked exactly."""

from __future__ import annotations

import types

import numpy as np

from jaxbench.task import load_task
from maxkernel.analysis.program import static_args
from maxkernel.templates.attention import FLASH_ATTENTION, analyse, plan
from maxkernel.templates.masks import CAUSAL, candidates, recover


def _module(source: str) -> types.ModuleType:
    module = types.ModuleType("candidate")
    exec(compile(source, "candidate.py", "exec"), module.__dict__)
    return module


def test_masks_are_recovered_as_formulas_that_match_the_reference_at_every_size() -> None:
    causal = plan(load_task("1p_Flash_Attention"), ("cpu", "full"))
    assert not isinstance(causal, str) and causal.mask is CAUSAL
    task = load_task("4p_Sparse_Attention")
    sparse = plan(task, ("cpu", "full"))
    assert not isinstance(sparse, str) and sparse.mask is not None
    assert sparse.mask.params == ("block_size", "window_blocks", "global_blocks")
    for size in ("cpu", "full"):
        shape = analyse(task, size)
        assert not isinstance(shape, str)
        assert np.array_equal(sparse.mask.evaluate(shape.seq_q, shape.seq_k, static_args(task, size)), shape.mask)


def test_a_mask_no_formula_reproduces_is_refused() -> None:
    rows, cols = np.arange(64)[:, None], np.arange(64)[None, :]
    strided = np.broadcast_to((rows - cols) % 3 == 0, (64, 64)) & (cols <= rows)
    static = {"block_size": 8, "window_blocks": 2, "global_blocks": 1}
    assert isinstance(recover([(strided, static)]), str)
    assert recover([(np.ones((64, 64), bool), static)]) is None
    # Parameters are bound by name: a permutation that happens to agree at one size must agree at all.
    exact = next(f for f in candidates(static) if f.params == ("block_size", "window_blocks", "global_blocks"))
    found = recover([(exact.evaluate(64, 64, static), static)])
    assert found is not None and not isinstance(found, str) and found.params == exact.params


def test_causal_schedule_visits_only_the_blocks_on_and_below_the_diagonal() -> None:
    task = load_task("1p_Flash_Attention")
    module = _module(FLASH_ATTENTION.render(task, {"block_q": 256, "block_k": 256}, ("cpu", "full")))
    q_blocks, kv_blocks, flags = (np.asarray(x) for x in module._schedule(1024, 1024, 256, 256))
    assert list(zip(q_blocks.tolist(), kv_blocks.tolist())) == [(i, j) for i in range(4) for j in range(i + 1)]
    first, last, partial = (flags & module.FIRST) != 0, (flags & module.LAST) != 0, (flags & module.PARTIAL) != 0
    assert np.array_equal(first, kv_blocks == 0) and np.array_equal(last, kv_blocks == q_blocks)
    assert np.array_equal(partial, kv_blocks == q_blocks)  # only diagonal blocks apply the mask


def test_block_sparse_schedule_skips_invisible_blocks_and_marks_whole_ones() -> None:
    task = load_task("4p_Sparse_Attention")
    module = _module(FLASH_ATTENTION.render(task, {"block_q": 512, "block_k": 512}, ("cpu", "full")))
    static = static_args(task, "full")
    shape = analyse(task, "full")
    assert not isinstance(shape, str)
    q_blocks, kv_blocks, flags = (np.asarray(x) for x in module._schedule(4096, 4096, 512, 512, **static))
    tiles = shape.mask.reshape(8, 512, 8, 512)
    visible = {(i, j) for i in range(8) for j in range(8) if tiles[i, :, j].any()}
    assert set(zip(q_blocks.tolist(), kv_blocks.tolist())) == visible and len(q_blocks) == len(visible) < 64
    for i, j, f in zip(q_blocks, kv_blocks, flags):
        assert bool(f & module.PARTIAL) == (not tiles[i, :, j].all())


def test_a_mask_too_large_to_evaluate_declines_the_template_instead_of_raising(monkeypatch) -> None:
    """A mask past the evaluation limit (llama's causal mask at seq 8192: two [s, s] iotas) is a reason the
    template gives, not an exception that ends the planner."""
    from maxkernel.rewrites import blocked_attention, numeric
    from maxkernel.templates import attention

    def too_large(program, var):
        raise numeric.TooLargeToEvaluate(f"evaluating {var} here would take 1024 MiB (limit 512 MiB)")

    task = load_task("1p_Flash_Attention")
    monkeypatch.setattr(blocked_attention, "evaluate_static", too_large)
    monkeypatch.setattr(attention, "_ANALYSED", {})
    reason = analyse(task, "full")
    assert isinstance(reason, str) and reason.startswith("mask not evaluated at full")
    assert isinstance(plan(task, ("cpu", "full")), str)
