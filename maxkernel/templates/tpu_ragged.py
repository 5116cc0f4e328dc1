"""Ragged paged attention as a Pallas TPU kernel: a batch mixing decode and prefill chunks over a paged KV cache.

The task: q [tokens, q_heads, head_dim] packs the queries of the sequences back to back (``cu_q_lens``
[seqs + 1] marks the boundaries), k and v pages [pages, page_size, kv_heads, head_dim], a page table [seqs,
pages_per_seq] and kv lengths [seqs]; query ``i`` of a sequence of kv length ``L`` and query length ``Q``
sees kv positions ``0 .. L - Q + i``. The roles are read from the argument shapes and the reference is
confirmed, on a ``cpu``-size draw, against that computation in float64 before the template applies.

What the kernel does, and why:
- the grid is (sequence, kv head, kv block), the kv-block axis innermost: a kv block is ``PAGES_PER_BLOCK``
  entries of the sequence's page table, each page's rows of the kv head copied from HBM by a manual DMA
  (pages are scattered, and a page holds every kv head, so no BlockSpec can fetch them); pages at or past the
  sequence's kv length are never copied and blocks there are not computed, so the bytes read follow the
  lengths;
- the query block is the sequence's rows, read at the element offset ``cu_q_lens[s]`` (scalar prefetch) of
  a head-major copy of q, ``max_q_len`` rows rounded up to the bf16 tile; the query heads sharing a kv head
  are folded into its rows, so each page is read once per group;
- MXU operands in the input dtype, f32 accumulation; the causal mask per row; masked scores take a large
  finite value; the output is normalised once, after the sequence's last kv block, written per sequence,
  and XLA unpacks the rows into the packed token order.
Shapes are read from the arguments; the pages per block is a named constant, shrunk only to divide a smaller
page table, so the same body runs at every size. Every grid axis is static: the twin check sees the blocks
a check runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from maxkernel.analysis.program import arg_names, static_args
from maxkernel.templates.base import FIT_SOURCE, TemplateSpace, analysed_at, tpu_target
from maxkernel.templates.tpu_gemm import _vmem_cap

if TYPE_CHECKING:
    from jaxbench.task import Task
    from maxkernel.analysis import TaskAnalysis

TPU_PAGES_PER_BLOCK = (8, 16, 32, 64, 128)
Q_TILE = 16  # query rows are rounded up to the bf16 (16, 128) tile


@dataclass(frozen=True)
class RaggedShape:
    """A ragged paged attention's extents and which argument plays which role."""

    tokens: int
    q_heads: int
    kv_heads: int
    head_dim: int
    page_size: int
    pages_per_seq: int
    seqs: int
    max_q_len: int
    names: tuple[tuple[str, str], ...]  # role -> argument or static name

    @property
    def group(self) -> int:
        return self.q_heads // self.kv_heads

    @property
    def q_block(self) -> int:
        return -(-self.max_q_len // Q_TILE) * Q_TILE

    def name(self, role: str) -> str:
        return dict(self.names)[role]


def _roles(task: "Task", size: str, choice: tuple[bool, int] = (False, 0)) -> RaggedShape | str:
    """The roles of the arguments, read from their shapes and dtypes, or why they do not fit. What shapes
    cannot tell is ``choice``: whether the second pages argument holds the keys (``True``), and which float
    static is the scale; :func:`analyse` settles both on values."""
    import jax.numpy as jnp

    from maxkernel.analysis.program import input_shapes

    names = arg_names(task)
    shapes = list(input_shapes(task, size))
    floats = [(n, s) for n, s in zip(names, shapes) if jnp.issubdtype(s.dtype, jnp.floating)]
    ints = [(n, s) for n, s in zip(names, shapes) if jnp.issubdtype(s.dtype, jnp.integer)]
    q = [(n, s) for n, s in floats if len(s.shape) == 3]
    pages = [(n, s) for n, s in floats if len(s.shape) == 4]
    table = [(n, s) for n, s in ints if len(s.shape) == 2]
    vectors = [(n, s) for n, s in ints if len(s.shape) == 1]
    if len(q) != 1 or len(pages) != 2 or len(table) != 1 or len(vectors) != 2:
        return "not q, k and v pages, a page table, kv lengths and query boundaries"
    keys_second, scale_at = choice
    (qn, qs), (tn, ts) = q[0], table[0]
    (kn, ks), (vn, vs) = pages[::-1] if keys_second else pages
    seqs = ts.shape[0]
    lengths = [n for n, s in vectors if s.shape == (seqs,)]
    bounds = [n for n, s in vectors if s.shape == (seqs + 1,)]
    if len(lengths) != 1 or len(bounds) != 1 or ks.shape != vs.shape or ks.dtype != qs.dtype:
        return "kv lengths, query boundaries or pages that do not match the page table and q"
    tokens, q_heads, head_dim = qs.shape
    _, page_size, kv_heads, d = ks.shape
    if d != head_dim or q_heads % kv_heads:
        return "a head dimension or head counts the pages do not share with q"
    static = static_args(task, size)
    scales = float_statics(static)
    bounds_q = [k for k, v in static.items() if isinstance(v, int) and not isinstance(v, bool)]
    if scale_at >= len(scales) or len(bounds_q) != 1:
        return "no float scale and single integer query-length bound among the static arguments"
    roles = (("q", qn), ("k_pages", kn), ("v_pages", vn), ("page_table", tn), ("kv_lens", lengths[0]),
             ("cu_q_lens", bounds[0]), ("scale", scales[scale_at]), ("max_q_len", bounds_q[0]))
    return RaggedShape(tokens, q_heads, kv_heads, head_dim, page_size, ts.shape[1], seqs,
                       int(static[bounds_q[0]]), roles)


def float_statics(static: dict[str, Any]) -> list[str]:
    """The static arguments that may be the scale: the float ones, in the order the reference takes them."""
    return [k for k, v in static.items() if isinstance(v, float)]


def _attention64(a: RaggedShape, args: dict[str, Any], scale: float) -> np.ndarray:
    """Ragged paged attention in float64, as the task describes it."""
    q = np.asarray(args[a.name("q")], np.float64)
    k, v = (np.asarray(args[a.name(r)], np.float64) for r in ("k_pages", "v_pages"))
    table, lengths, cu = (np.asarray(args[a.name(r)]) for r in ("page_table", "kv_lens", "cu_q_lens"))
    out = np.zeros_like(q)
    for s in range(a.seqs):
        start, q_len, kv_len = int(cu[s]), int(cu[s + 1] - cu[s]), int(lengths[s])
        keys = k[table[s]].reshape(-1, a.kv_heads, a.head_dim)[:kv_len]
        values = v[table[s]].reshape(-1, a.kv_heads, a.head_dim)[:kv_len]
        for h in range(a.q_heads):
            scores = q[start:start + q_len, h] @ keys[:, h // a.group].T * scale
            visible = np.arange(kv_len)[None, :] <= kv_len - q_len + np.arange(q_len)[:, None]
            scores = np.where(visible, scores, -np.inf)
            p = np.exp(scores - scores.max(axis=1, keepdims=True))
            out[start:start + q_len, h] = (p / p.sum(axis=1, keepdims=True)) @ values[:, h // a.group]
    return out


def analyse(task: "Task", size: str) -> RaggedShape | str:
    """The ragged paged attention this task computes at ``size``, or why not. Which pages hold the keys and
    which float static is the scale are what a ``cpu`` draw confirms: the reference against ragged paged
    attention in float64 under each reading, the first that agrees kept at every size."""
    import itertools

    import jax

    cpu = _roles(task, "cpu")
    if isinstance(cpu, str):
        return cpu
    args, static = task.get_inputs(jax.random.key(0), "cpu")
    named = dict(zip(arg_names(task), args))
    got = np.asarray(task.reference(*args, **static), np.float64)
    for choice in itertools.product((False, True), range(len(float_statics(static)))):
        reading = _roles(task, "cpu", choice)
        if isinstance(reading, str):
            continue
        expected = _attention64(reading, named, float(static[reading.name("scale")]))
        if got.shape == expected.shape and np.allclose(got, expected, atol=2e-2, rtol=2e-2):
            return reading if size == "cpu" else _roles(task, size, choice)
    return "the reference does not compute ragged paged attention on a cpu-size draw"


def vmem_bytes(a: RaggedShape, pages_per_block: int, item: int = 2) -> int:
    """The k and v pages of one block, the double-buffered query and output blocks, the f32 accumulator and
    row statistics (lane-padded), and one block's f32 scores and probabilities."""
    keys = pages_per_block * a.page_size
    rows = a.group * a.q_block
    return (2 * keys * a.head_dim * item + 2 * 2 * rows * a.head_dim * item
            + rows * a.head_dim * 4 + 2 * rows * 128 * 4 + 3 * rows * keys * 4)


class RaggedPagedTemplate:
    name = "tpu_ragged_paged"
    description = ("ragged paged attention: query rows at scalar-prefetched offsets, kv pages DMA'd per GQA group "
                   "for the lengths, causal per row")

    def applies(self, task: "Task", analysis: "TaskAnalysis") -> str | None:
        found = analyse(task, "cpu")
        return found if isinstance(found, str) else None

    def space(self, task: "Task", analysis: "TaskAnalysis", target: str) -> TemplateSpace:
        if not tpu_target(target):
            return TemplateSpace(defaults={}, space={"pages_per_block": []})  # manual DMAs: a TPU kernel
        a = analyse(task, "full")
        assert not isinstance(a, str)
        cap = _vmem_cap(target)
        options = [p for p in TPU_PAGES_PER_BLOCK if a.pages_per_seq % p == 0 and (p * a.page_size) % 128 == 0
                   and vmem_bytes(a, p) <= cap]
        # Default: the fewest pages a block. Each page is two DMAs, which TPU interpret mode answers with host
        # callbacks, and the check keeps every sequence and head (halving the sequences alone breaks the
        # decode count, the heads alone the query group) with two blocks a sequence: at 32 pages a block
        # it would run about 112k callbacks a run, at 8 about 23k. Larger blocks (fewer grid steps, each a
        # fixed overhead at full size) stay in the space.
        default = min(options, default=0)
        return TemplateSpace(defaults={"pages_per_block": default}, space={"pages_per_block": options})

    def render(self, task: "Task", params: dict[str, Any], sizes: tuple[str, ...]) -> str:
        found = analysed_at(task, sizes, analyse, lambda s: s.names)
        return render_ragged(task, found[0], int(params["pages_per_block"]))


def render_ragged(task: "Task", a: RaggedShape, pages_per_block: int) -> str:
    n = a.name
    args = ", ".join(arg_names(task))
    return f'''"""{task.id}: ragged paged attention, page table, kv lengths and query boundaries by scalar prefetch.

Grid (sequence, kv head, kv block): a kv block is PAGES_PER_BLOCK entries of the sequence's page table, each
page's rows of the kv head copied from HBM by a DMA; pages past the kv length are never copied, blocks there
never computed. The query block is the sequence's rows of a head-major copy of q, read at the element offset
cu_q_lens[s], the query heads sharing a kv head folded into its rows; causal per row; MXU operands bf16 with
f32 accumulation; normalised once after the last block. Generated by MaxKernel's rules brain.
"""

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

PAGES_PER_BLOCK = {pages_per_block}  # page-table entries per kv block
Q_TILE = {Q_TILE}  # query rows a sequence's block rounds up to
MASK_VALUE = -1e30  # a masked score: finite, so no inf - inf
M_START = -1e20  # the running max starts above MASK_VALUE


{FIT_SOURCE}


def _ragged_kernel(lengths_ref, table_ref, cu_ref, q_ref, k_hbm, v_hbm, o_ref, k_buf, v_buf, sems, m_ref, l_ref,
                   acc_ref, *, scale):
    s, h, i = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    blocks = pl.num_programs(2)
    pages_per_block, page_size, head_dim = k_buf.shape
    keys = pages_per_block * page_size
    group, q_block = q_ref.shape[0], q_ref.shape[1]
    kv_len = lengths_ref[s]
    q_len = cu_ref[s + 1] - cu_ref[s]

    @pl.when(i == 0)
    def _init():  # a new sequence and kv head: fresh statistics
        m_ref[...] = jnp.full(m_ref.shape, M_START, jnp.float32)
        l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    @pl.when(i * keys < kv_len)
    def _block():
        first = s * (blocks * pages_per_block) + i * pages_per_block

        def copies(begin):
            def page(j, carry):
                @pl.when(i * keys + j * page_size < kv_len)  # pages past the length are never read
                def _copy():
                    index = table_ref[first + j]
                    for hbm, buf, which in ((k_hbm, k_buf, 0), (v_hbm, v_buf, 1)):
                        copy = pltpu.make_async_copy(hbm.at[index, :, h], buf.at[j], sems.at[which])
                        if begin:
                            copy.start()
                        else:
                            copy.wait()

                return carry

            jax.lax.fori_loop(0, pages_per_block, page, 0)

        copies(True)
        copies(False)
        k = k_buf[...].reshape(keys, head_dim)
        position = i * keys + jax.lax.broadcasted_iota(jnp.int32, (keys, 1), 0)
        # The buffer's pages past the length hold an older block's data (or nothing): zero value.
        v = jnp.where(position < kv_len, v_buf[...].reshape(keys, head_dim), 0)
        q = q_ref[...].reshape(group * q_block, head_dim)
        scores = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
        scores = scores * scale
        row = jax.lax.broadcasted_iota(jnp.int32, (group * q_block, 1), 0) % q_block
        col = i * keys + jax.lax.broadcasted_iota(jnp.int32, (1, keys), 1)
        # Query row r of the sequence sees kv positions up to kv_len - q_len + r (rows past q_len are dropped).
        visible = jnp.logical_and(col <= kv_len - q_len + row, col < kv_len)
        scores = jnp.where(visible, scores, MASK_VALUE)
        m_prev = m_ref[...]
        m_next = jnp.maximum(m_prev, jnp.max(scores, axis=1, keepdims=True))
        alpha = jnp.exp(m_prev - m_next)
        p = jnp.exp(scores - m_next)
        l_ref[...] = alpha * l_ref[...] + jnp.sum(p, axis=1, keepdims=True)
        pv = jax.lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
        acc_ref[...] = alpha * acc_ref[...] + pv
        m_ref[...] = m_next

    @pl.when(i == blocks - 1)
    def _finish():  # the softmax normalisation, once per sequence and kv head
        out = acc_ref[...] * (1.0 / l_ref[...])
        o_ref[...] = out.reshape(o_ref.shape).astype(o_ref.dtype)


def kernel({args}, **static):
    q = {n("q")}
    tokens, q_heads, head_dim = q.shape
    _, page_size, kv_heads, _ = {n("k_pages")}.shape
    seqs, pages_per_seq = {n("page_table")}.shape
    group = q_heads // kv_heads  # consecutive query heads share a kv head
    pages_per_block = _fit(PAGES_PER_BLOCK, pages_per_seq)
    q_block = -(-static[{n("max_q_len")!r}] // Q_TILE) * Q_TILE
    # Head-major queries, padded so that every sequence's block of q_block rows lies inside.
    qt = jnp.pad(q.reshape(tokens, kv_heads, group, head_dim).transpose(1, 2, 0, 3),
                 ((0, 0), (0, 0), (0, q_block), (0, 0)))
    body = functools.partial(_ragged_kernel, scale=static[{n("scale")!r}])
    rows = group * q_block
    planned = (2 * pages_per_block * page_size * head_dim * q.dtype.itemsize + 4 * rows * head_dim * q.dtype.itemsize
               + rows * head_dim * 4 + 2 * rows * 128 * 4 + 3 * rows * pages_per_block * page_size * 4)
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=3,  # kv lengths, page table, query boundaries
        grid=(seqs, kv_heads, pages_per_seq // pages_per_block),
        in_specs=[
            # Element offsets on every axis: the sequence's rows start at cu_q_lens[s].
            pl.BlockSpec((None, pl.Element(group), pl.Element(q_block), pl.Element(head_dim)),
                         lambda s, h, i, lens, tbl, cu: (h, 0, cu[s], 0)),
            pl.BlockSpec(memory_space=pl.ANY),  # k pages stay in HBM: copied page by page
            pl.BlockSpec(memory_space=pl.ANY),  # v pages
        ],
        out_specs=pl.BlockSpec((None, None, group, q_block, head_dim), lambda s, h, i, *_: (s, h, 0, 0, 0)),
        scratch_shapes=[
            pltpu.VMEM((pages_per_block, page_size, head_dim), {n("k_pages")}.dtype),
            pltpu.VMEM((pages_per_block, page_size, head_dim), {n("v_pages")}.dtype),
            pltpu.SemaphoreType.DMA((2,)),  # k, v
            pltpu.VMEM((rows, 1), jnp.float32),  # running row max
            pltpu.VMEM((rows, 1), jnp.float32),  # running row sum
            pltpu.VMEM((rows, head_dim), jnp.float32),  # unnormalised output
        ],
    )
    per_seq = pl.pallas_call(
        body,
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct((seqs, kv_heads, group, q_block, head_dim), q.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary"),
                                             vmem_limit_bytes=max(32 << 20, planned + (planned >> 1))),
    )({n("kv_lens")}, {n("page_table")}.reshape(-1), {n("cu_q_lens")}, qt, {n("k_pages")}, {n("v_pages")})
    per_seq = per_seq.transpose(0, 3, 1, 2, 4).reshape(seqs, q_block, q_heads, head_dim)
    # Unpack: token t belongs to the sequence s with cu_q_lens[s] <= t < cu_q_lens[s + 1].
    t = jnp.arange(tokens, dtype=jnp.int32)
    seq_of_t = jnp.searchsorted({n("cu_q_lens")}[1:], t, side="right")
    return per_seq[seq_of_t, t - {n("cu_q_lens")}[seq_of_t]]
'''


TPU_RAGGED_PAGED = RaggedPagedTemplate()
