"""Paged decode attention as a Pallas TPU kernel: page table and lengths by scalar prefetch.

The task is the one :mod:`maxkernel.rewrites.paged` recognises: one query token per sequence, q
[batch, q_heads, head_dim], pages [kv_heads, total_pages, page_size, head_dim], a page table [batch,
pages_per_seq] and lengths [batch]. The kernel's grid is (sequence, kv head, kv block): a kv block is
``pages_per_block`` consecutive entries of the sequence's page table, copied page by page from HBM into a
double-buffered VMEM slot by manual DMAs (pages are scattered, so no BlockSpec can fetch them), the next
block's copies started before this one is used: the sequence's next block, or after its last one the first
block of the next (sequence, kv head), so the grid runs in order and no step waits for a whole block. Pages at or past the sequence's length are never copied,
and blocks there are not computed: the bytes read follow the lengths, whatever the block size.

What an expert writes, and why:
- the query heads that share a kv head form one query block, so each kv page is read once per group;
- MXU operands in the input dtype with f32 accumulation (``preferred_element_type``);
- masked positions (the tail of the last block) take a large finite score, and the output is normalised
  once, after the sequence's last block;
- the kv-block axis is a grid axis (not a loop whose trip count is read from the lengths), so the blocks
  a check runs are visible to the twin check: a check size keeps at least two of them.
Shapes are read from the arguments; the pages per block is a named constant, shrunk only to divide a
smaller page table, so the same body runs at every size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from maxkernel.analysis.program import arg_names, trace_program
from maxkernel.rewrites.emit import EmitError, dtype_expr, scalar_text
from maxkernel.templates.base import FIT_SOURCE, TPU_VMEM_BUDGET, TemplateSpace, analysed_at, divisors, tpu_target

if TYPE_CHECKING:
    from jaxbench.task import Task
    from maxkernel.analysis import TaskAnalysis

# Pages per kv block on TPU: powers of two, so that a block of 16-token pages is a multiple of 128 keys.
TPU_PAGES_PER_BLOCK = (8, 16, 32, 64, 128, 256)


@dataclass
class PagedShape:
    batch: int
    q_heads: int
    kv_heads: int
    head_dim: int
    page_size: int
    pages_per_seq: int
    scale: float
    dtype: Any
    out_dtype: Any
    names: dict[str, str]  # role (q, k_pages, v_pages, page_table, lengths) -> argument name

    @property
    def group(self) -> int:
        return self.q_heads // self.kv_heads


def analyse(task: "Task", size: str) -> PagedShape | str:
    """The paged decode this task's reference computes at ``size``, or why it is not one."""
    from maxkernel.rewrites.paged import match_paged  # the rewrites package imports the template registry

    program = trace_program(task, size).dce()
    roles = match_paged(program)
    if isinstance(roles, str):
        return roles
    by_name = {v.name: v for v in program.inputs}
    q, pages, table = by_name[roles.q], by_name[roles.k_pages], by_name[roles.page_table]
    names = {"q": roles.q, "k_pages": roles.k_pages, "v_pages": roles.v_pages, "page_table": roles.page_table,
             "lengths": roles.lengths}
    return PagedShape(q.shape[0], q.shape[1], pages.shape[0], q.shape[2], pages.shape[2], table.shape[1],
                      roles.scale, np.dtype(q.dtype), np.dtype(roles.out_dtype), names)


def vmem_bytes(a: PagedShape, pages_per_block: int) -> int:
    """Two slots of k and v pages, the double-buffered query and output blocks, the f32 accumulator and
    row statistics (lane-padded), and one block's f32 scores and probabilities."""
    item, out = a.dtype.itemsize, a.out_dtype.itemsize
    keys = pages_per_block * a.page_size
    rows = max(a.group, 8)
    pages = 2 * 2 * keys * a.head_dim * item
    blocks = 2 * rows * a.head_dim * (item + out)
    scratch = rows * a.head_dim * 4 + 2 * rows * 128 * 4
    return pages + blocks + scratch + 2 * rows * keys * 4


def _scale_text(shapes: list[PagedShape]) -> str | None:
    if all(math.isclose(s.scale, 1.0 / math.sqrt(s.head_dim), rel_tol=1e-6) for s in shapes):
        return "1.0 / math.sqrt(head_dim)"
    if all(math.isclose(s.scale, shapes[0].scale, rel_tol=1e-9) for s in shapes):
        return scalar_text(np.float64(shapes[0].scale))
    return None


class PagedDecodeTemplate:
    name = "paged_attention"
    description = "paged decode attention: scalar-prefetched page table and lengths, kv pages DMA'd per GQA group"

    def applies(self, task: "Task", analysis: "TaskAnalysis") -> str | None:
        found = analyse(task, "cpu")
        return found if isinstance(found, str) else None

    def space(self, task: "Task", analysis: "TaskAnalysis", target: str) -> TemplateSpace:
        a = analyse(task, "full" if tpu_target(target) else "cpu")
        assert not isinstance(a, str)
        if tpu_target(target):
            options = [p for p in TPU_PAGES_PER_BLOCK
                       if a.pages_per_seq % p == 0 and (p * a.page_size) % 128 == 0
                       and vmem_bytes(a, p) <= TPU_VMEM_BUDGET]
            # Default: the largest block. Pages past the length are never copied, so a larger block costs only
            # masked scores in its last block, and saves grid steps (each a fixed overhead).
            default = max(options, default=0)
            return TemplateSpace(defaults={"pages_per_block": default}, space={"pages_per_block": options})
        # CPU (interpret mode): grid steps are expensive, so only a few large blocks are worth trying.
        options = sorted(d for d in divisors(a.pages_per_seq) if a.pages_per_seq // d <= 4)
        return TemplateSpace(defaults={"pages_per_block": options[-1]}, space={"pages_per_block": options})

    def render(self, task: "Task", params: dict[str, Any], sizes: tuple[str, ...]) -> str:
        found = analysed_at(task, sizes, analyse, lambda s: (s.dtype, s.out_dtype, tuple(s.names.items())))
        scale = _scale_text(found)
        if scale is None:
            raise EmitError("a score scale that changes with size but is not 1/sqrt(head_dim)")
        return render_paged(task, found[0], scale, int(params["pages_per_block"]))


def render_paged(task: "Task", a: PagedShape, scale_text: str, pages_per_block: int) -> str:
    n = a.names
    args = ", ".join(arg_names(task))
    f32 = a.dtype == np.float32
    precision = ", precision=jax.lax.Precision.HIGHEST" if f32 else ""
    lines = [
        f'"""{task.id}: paged decode attention, page table and lengths by scalar prefetch.\n',
        "Grid (sequence, kv head, kv block): a kv block is PAGES_PER_BLOCK entries of the sequence's page table,",
        "copied page by page from HBM into one of two VMEM slots; the next block's copies (this sequence's, or the",
        "next sequence's first) start before this block is used; pages past the length are never copied. The query",
        "heads sharing a kv head are one query block, so each page is read once per group. MXU operands stay in",
        "the input dtype and accumulate in f32; the output is normalised once, after the last block.",
        "Generated by MaxKernel's rules brain.",
        '"""',
        "",
        "import functools",
        "import math",
        "",
        "import jax",
        "import jax.numpy as jnp",
        "from jax.experimental import pallas as pl",
        "from jax.experimental.pallas import tpu as pltpu",
        "",
        f"PAGES_PER_BLOCK = {pages_per_block}  # page-table entries per kv block",
        "MASK_VALUE = -1e30  # a masked score: finite, so no inf - inf",
        "M_START = -1e20  # the running max starts above MASK_VALUE",
        "",
        "",
        FIT_SOURCE,
        "",
        "",
        "def _paged_kernel(lengths_ref, table_ref, slot_ref, started_ref, q_ref, k_hbm, v_hbm, o_ref, k_buf, v_buf,",
        "                  sems, m_ref, l_ref, acc_ref, *, pages_per_block, scale):",
        "    b, h, i = pl.program_id(0), pl.program_id(1), pl.program_id(2)",
        "    batch, heads, blocks = pl.num_programs(0), pl.num_programs(1), pl.num_programs(2)",
        "    page_size = k_buf.shape[2]",
        "    keys = pages_per_block * page_size",
        "    length = lengths_ref[b]",
        "",
        "    def copies(seq, head, block, slot, begin):",
        '        """Start (``begin``) or wait for the DMAs of one kv block\'s k and v pages into VMEM slot ``slot``."""',
        "        first = seq * (blocks * pages_per_block) + block * pages_per_block",
        "        seq_length = lengths_ref[seq]",
        "",
        "        def page(j, carry):",
        "            @pl.when(block * keys + j * page_size < seq_length)  # pages past the length are never read",
        "            def _copy():",
        "                index = table_ref[first + j]",
        "                for hbm, buf, which in ((k_hbm, k_buf, 0), (v_hbm, v_buf, 1)):",
        "                    copy = pltpu.make_async_copy(hbm.at[head, index], buf.at[slot, j], sems.at[which, slot])",
        "                    if begin:",
        "                        copy.start()",
        "                    else:",
        "                        copy.wait()",
        "",
        "            return carry",
        "",
        "        jax.lax.fori_loop(0, pages_per_block, page, 0)",
        "",
        "    @pl.when(i == 0)",
        "    def _init():  # a new sequence and kv head: fresh statistics",
        "        m_ref[...] = jnp.full(m_ref.shape, M_START, jnp.float32)",
        "        l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)",
        "        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)",
        "",
        "    @pl.when(i * keys < length)",
        "    def _block():",
        "        slot = slot_ref[0]",
        "",
        "        @pl.when(jnp.logical_and(i == 0, started_ref[0] == 0))",
        "        def _own_first():  # nothing started this block's copies (the first step, or after an empty sequence)",
        "            copies(b, h, 0, slot, True)",
        "",
        "        # While this block is used, the next one's pages stream in: this sequence's next block, or after",
        "        # its last, the first block of the next (sequence, kv head) in grid order.",
        "        last = jnp.logical_or(i + 1 == blocks, (i + 1) * keys >= length)",
        "        next_h = jnp.where(h + 1 < heads, h + 1, 0)",
        "        next_b = jnp.where(h + 1 < heads, b, b + 1)",
        "        ahead = jnp.logical_and(jnp.logical_and(last, next_b < batch),",
        "                                lengths_ref[jnp.minimum(next_b, batch - 1)] > 0)",
        "",
        "        @pl.when(jnp.logical_not(last))",
        "        def _next_block():",
        "            copies(b, h, i + 1, 1 - slot, True)",
        "",
        "        @pl.when(ahead)",
        "        def _next_sequence():",
        "            copies(next_b, next_h, 0, 1 - slot, True)",
        "",
        "        @pl.when(last)",
        "        def _flag():",
        "            started_ref[0] = ahead.astype(jnp.int32)",
        "",
        "        copies(b, h, i, slot, False)",
        "        slot_ref[0] = 1 - slot",
        "        k = k_buf[slot].reshape(keys, k_buf.shape[3])",
        "        # The slot's pages past the length hold an older block's data (or nothing): zero weight, zero value.",
        "        row = i * keys + jax.lax.broadcasted_iota(jnp.int32, (keys, 1), 0)",
        "        v = jnp.where(row < length, v_buf[slot].reshape(keys, v_buf.shape[3]), 0)",
        f"        s = jax.lax.dot_general(q_ref[...], k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32{precision})",
        "        s = s * scale",
        "        position = i * keys + jax.lax.broadcasted_iota(jnp.int32, (1, keys), 1)",
        "        s = jnp.where(position < length, s, MASK_VALUE)",
        "        m_prev = m_ref[...]",
        "        m_next = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))",
        "        alpha = jnp.exp(m_prev - m_next)",
        "        p = jnp.exp(s - m_next)",
        "        l_ref[...] = alpha * l_ref[...] + jnp.sum(p, axis=1, keepdims=True)",
        "        pv = jax.lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())),",
        f"                                 preferred_element_type=jnp.float32{precision})",
        "        acc_ref[...] = alpha * acc_ref[...] + pv",
        "        m_ref[...] = m_next",
        "",
        "    @pl.when(i == blocks - 1)",
        "    def _finish():  # the softmax normalisation, once per query block",
        "        o_ref[...] = (acc_ref[...] * (1.0 / l_ref[...])).astype(o_ref.dtype)",
        "",
        "",
        f"def kernel({args}):",
        f"    batch, q_heads, head_dim = {n['q']}.shape",
        f"    kv_heads, _, page_size, _ = {n['k_pages']}.shape",
        f"    pages_per_seq = {n['page_table']}.shape[1]",
        "    group = q_heads // kv_heads  # consecutive query heads share a kv head",
        "    pages_per_block = _fit(PAGES_PER_BLOCK, pages_per_seq)",
        f"    q = {n['q']}.reshape(batch, kv_heads, group, head_dim)",
        f"    body = functools.partial(_paged_kernel, pages_per_block=pages_per_block, scale={scale_text})",
        "    grid_spec = pltpu.PrefetchScalarGridSpec(",
        "        num_scalar_prefetch=4,  # lengths, page table, the slot in use, whether the next block was started",
        "        grid=(batch, kv_heads, pages_per_seq // pages_per_block),",
        "        in_specs=[",
        "            pl.BlockSpec((None, None, group, head_dim), lambda b, h, i, *_: (b, h, 0, 0)),",
        "            pl.BlockSpec(memory_space=pl.ANY),  # k pages stay in HBM: copied page by page",
        "            pl.BlockSpec(memory_space=pl.ANY),  # v pages",
        "        ],",
        "        out_specs=pl.BlockSpec((None, None, group, head_dim), lambda b, h, i, *_: (b, h, 0, 0)),",
        "        scratch_shapes=[",
        f"            pltpu.VMEM((2, pages_per_block, page_size, head_dim), {n['k_pages']}.dtype),  # k slots",
        f"            pltpu.VMEM((2, pages_per_block, page_size, head_dim), {n['v_pages']}.dtype),  # v slots",
        "            pltpu.SemaphoreType.DMA((2, 2)),  # (k or v, slot)",
        "            pltpu.VMEM((group, 1), jnp.float32),  # running row max",
        "            pltpu.VMEM((group, 1), jnp.float32),  # running row sum",
        "            pltpu.VMEM((group, head_dim), jnp.float32),  # unnormalised output",
        "        ],",
        "    )",
        "    out = pl.pallas_call(",
        "        body,",
        "        grid_spec=grid_spec,",
        f"        out_shape=jax.ShapeDtypeStruct(q.shape, {dtype_expr(a.out_dtype)}),",
        "        # Every axis in order: each step starts the copies of the step after it, across sequences too.",
        '        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary", "arbitrary", "arbitrary")),',
        f"    )({n['lengths']}, {n['page_table']}.reshape(-1), jnp.zeros((1,), jnp.int32), jnp.zeros((1,), jnp.int32),",
        f"      q, {n['k_pages']}, {n['v_pages']})",
        "    return out.reshape(batch, q_heads, head_dim)",
    ]
    return "\n".join(lines) + "\n"


PAGED_ATTENTION = PagedDecodeTemplate()
