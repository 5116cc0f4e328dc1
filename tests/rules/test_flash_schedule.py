"""The flash template's masks and block schedules: recovered formulas and visited blocks, checked exactly."""

from __future__ import annotations

import pytest
import types

import jax
import jax.numpy as jnp
import numpy as np

from jaxbench.task import load_task
from maxkernel.analysis.program import ProgramBuilder, static_args
from maxkernel.templates.attention import FLASH_ATTENTION, analyse, match, plan
from maxkernel.templates.masks import CAUSAL, candidates, recover


def _module(source: str) -> types.ModuleType:
    module = types.ModuleType("candidate")
    exec(compile(source, "candidate.py", "exec"), module.__dict__)
    return module


@pytest.mark.slow
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


def _attention_program(mask_of, heads: int = 4, seq: int = 512):
    """The program of a bf16 causal-style attention whose mask ``mask_of(seq, heads)`` returns."""
    import jax
    import jax.numpy as jnp

    from maxkernel.analysis.program import ProgramBuilder

    def attention(q, k, v):
        scores = jnp.einsum("bhqd,bhkd->bhqk", q.astype(jnp.float32), k.astype(jnp.float32)) / 8.0
        probs = jax.nn.softmax(jnp.where(mask_of(seq, heads), scores, -jnp.inf), axis=-1)
        return jnp.einsum("bhqk,bhkd->bhqd", probs, v.astype(jnp.float32)).astype(jnp.bfloat16)

    shape = jax.ShapeDtypeStruct((1, heads, seq, 64), jnp.bfloat16)
    return ProgramBuilder().build(jax.make_jaxpr(attention)(shape, shape, shape), ["q", "k", "v"]).dce()


def test_a_causal_mask_built_from_square_iotas_is_matched_past_the_evaluation_limit(monkeypatch) -> None:
    """``jnp.tril(jnp.ones((s, s)))`` holds [s, s] int32 iotas: evaluated node by node it passes the limit
    (llama's mask at seq 8192 needs 1 GiB), so the heads check is reduced by XLA one slice at a time; the
    mask is still the exact causal one, and a mask that differs between heads is still refused."""
    import jax
    import jax.numpy as jnp

    from maxkernel.rewrites import numeric
    from maxkernel.templates.attention import match

    def tril(seq, heads):
        return jnp.tril(jnp.ones((seq, seq), dtype=bool))

    program = _attention_program(tril)
    mask_node = next(n for n in program.nodes if n.prim == "select_n")
    limit = numeric.result_bytes(program.ancestors(mask_node.ins[0])) // 2
    monkeypatch.setattr(numeric, "CONCRETE_BYTES", limit)
    with np.testing.assert_raises(numeric.TooLargeToEvaluate):  # what the old heads check did
        numeric.evaluate_nodes(program.ancestors(mask_node.ins[0]), {})
    shape = match(program)
    assert not isinstance(shape, str), shape
    assert np.array_equal(shape.mask, np.tril(np.ones((512, 512), bool)))
    assert recover([(shape.mask, {})]) is CAUSAL

    def per_head(seq, heads):  # head h sees h keys fewer: no single formula serves every head
        rows = jax.lax.broadcasted_iota(jnp.int32, (1, heads, seq, seq), 2)
        cols = jax.lax.broadcasted_iota(jnp.int32, (1, heads, seq, seq), 3)
        head = jax.lax.broadcasted_iota(jnp.int32, (1, heads, seq, seq), 1)
        return cols <= jnp.maximum(rows - head, 0)

    assert match(_attention_program(per_head, seq=128)) == "a mask that differs between heads"


def test_a_mask_too_large_to_evaluate_declines_the_template_instead_of_raising(monkeypatch) -> None:
    """A mask past the evaluation limit (llama's causal mask at seq 8192: two [s, s] iotas) is a reason the
    template gives, not an exception that ends the planner."""
    from maxkernel.rewrites import numeric
    from maxkernel.templates import attention

    task = load_task("1p_Flash_Attention")
    monkeypatch.setattr(numeric, "CONCRETE_BYTES", 1 << 10)  # even one [seq, seq] slice is past it
    monkeypatch.setattr(attention, "_ANALYSED", {})
    reason = analyse(task, "full")
    assert isinstance(reason, str) and reason.startswith("mask not evaluated"), reason
    assert isinstance(plan(task, ("cpu", "full")), str)


def _capped_attention(transform, mask_first: bool = False):  # type: ignore[no-untyped-def]
    """The program of a small causal attention whose scaled scores pass through ``transform``."""
    def attention(q, k, v):  # type: ignore[no-untyped-def]
        s = jnp.einsum("bhqd,bhkd->bhqk", q, k) / 8.0
        visible = jnp.tril(jnp.ones((16, 16), dtype=bool))
        s = transform(jnp.where(visible, s, -jnp.inf)) if mask_first else jnp.where(visible, transform(s), -jnp.inf)
        return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(s, axis=-1), v)

    x = jnp.ones((1, 2, 16, 8), jnp.float32)
    return ProgramBuilder().build(jax.make_jaxpr(attention)(x, x, x), ["q", "k", "v"])


def test_a_soft_cap_is_read_as_one_and_any_other_tanh_of_the_scores_is_refused() -> None:
    capped = match(_capped_attention(lambda s: 30.0 * jnp.tanh(s / 30.0)))
    assert not isinstance(capped, str) and capped.soft_cap == 30.0 and abs(capped.scale - 0.125) < 1e-12
    assert isinstance(match(_capped_attention(jnp.tanh)), str)  # no cap around the tanh
    assert isinstance(match(_capped_attention(lambda s: 30.0 * jnp.tanh(s / 20.0))), str)  # two different caps
    refused = match(_capped_attention(lambda s: 30.0 * jnp.tanh(s / 30.0), mask_first=True))
    assert isinstance(refused, str) and "mask" in refused  # tanh of a hidden score is not hidden

