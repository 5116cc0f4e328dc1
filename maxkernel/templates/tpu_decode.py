"""TPU decode attention over a contiguous KV cache: one query token per sequence, per-sequence lengths, GQA.

The computation is recognised by what it computes, not by how it is written: the reference's inputs are
sorted by shape (one float [batch, q_heads, head_dim] query, two float caches of one shape with a sequence and
a kv-head axis, one integer [batch] of lengths), and every assignment of the caches to keys and values, each
cache layout ([batch, cache_len, kv_heads, head_dim] or [batch, kv_heads, cache_len, head_dim]) and the scale
(1/sqrt(head_dim) or none) is tried against the reference's output at ``cpu`` size: the one that computes
``softmax(q k^T * scale, keys < length) v``, query head h reading kv head h // (q_heads / kv_heads), is the one
rendered. A sliding window (only the last ``window`` valid positions attended, ``length - window <= key``) is
an integer static found the same way: each integer static is changed and the reference run again, and the one
whose new value moves the window as the window would is the window. A static that changes the result in any
other way refuses the match: a window that happens not to bind at ``cpu`` size must not pass for none.

What an expert writes, and why:
- the grid is (sequence, split, kv block): each step reads ``BLOCK_K`` cache positions of every kv head once
  (the cache is read in its stored layout, a [cache_len, kv_heads * head_dim] slab per sequence needs no
  transpose), the lengths come by scalar prefetch, blocks at or past a sequence's length are neither computed
  nor fetched (their block index repeats the last valid one, so the pipeline skips the copy); with a window,
  the grid spans only the blocks a window can touch, counted from the block where the sequence's window
  starts;
- every query head of the sequence is one query block; the scores of kv head h are kept for the rows of its
  group, so the MXU work stays a few query rows per key and the step stays bound by reading the cache;
- online softmax in f32 (running max, sum and accumulator in VMEM), masked scores a large finite value;
- ``SPLITS`` ranges of the cache per sequence are parallel grid steps whose partial results (accumulator,
  max and sum) are combined in XLA: with few sequences a split fills the chip's cores;
- MXU operands in the input dtype with f32 accumulation; the probabilities go to the value product in the
  values' dtype, as the reference rounds them.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from maxkernel.analysis.program import arg_names, trace_program
from maxkernel.rewrites.emit import EmitError
from maxkernel.templates.base import TPU_VMEM_BUDGET, TemplateSpace, tpu_target

if TYPE_CHECKING:
    from jaxbench.task import Task
    from maxkernel.analysis import TaskAnalysis

TPU_BLOCKS_K = (256, 512, 1024, 2048)
TPU_SPLITS = (1, 2, 4)


@dataclass(frozen=True)
class DecodeShape:
    """The roles the reference's inputs play (argument positions) and the shapes of one size."""

    q: int
    k: int
    v: int
    lengths: int
    layout: str  # "thd": [batch, cache_len, kv_heads, head_dim]; "htd": [batch, kv_heads, cache_len, head_dim]
    scaled: bool  # scores multiplied by 1/sqrt(head_dim)
    batch: int
    q_heads: int
    kv_heads: int
    cache_len: int
    head_dim: int
    dtype: str
    out_dtype: str
    window: str | None = None  # the integer static that is a sliding window's width (None: no window)


def _candidates(shapes: list[Any]) -> list[DecodeShape]:
    """Every reading of the inputs as (q, k, v, lengths) that the shapes allow."""
    ints = [i for i, s in enumerate(shapes) if np.dtype(s.dtype).kind in "iu" and len(s.shape) == 1]
    q3 = [i for i, s in enumerate(shapes) if np.dtype(s.dtype).kind == "f" or str(s.dtype) == "bfloat16"]
    if len(shapes) != 4 or len(ints) != 1:
        return []
    found = []
    queries = [i for i in q3 if len(shapes[i].shape) == 3]
    caches = [i for i in q3 if len(shapes[i].shape) == 4]
    if len(queries) != 1 or len(caches) != 2 or shapes[caches[0]].shape != shapes[caches[1]].shape:
        return []
    q, lengths = queries[0], ints[0]
    b, hq, d = shapes[q].shape
    cache = shapes[caches[0]].shape
    if shapes[lengths].shape != (b,) or cache[0] != b or cache[3] != d:
        return []
    for (k, v), layout, scaled in itertools.product(itertools.permutations(caches), ("thd", "htd"), (True, False)):
        t, hkv = (cache[1], cache[2]) if layout == "thd" else (cache[2], cache[1])
        if hkv and hq % hkv == 0:
            found.append(DecodeShape(q, k, v, lengths, layout, scaled, b, hq, hkv, t, d, str(shapes[q].dtype), ""))
    return found


def decode_attention(q: Any, k: Any, v: Any, lengths: Any, layout: str, scaled: bool,
                     window: int | None = None) -> np.ndarray:
    """What the matched reference computes, in float64 (the probe's answer); ``window``: only keys at or after
    ``length - window`` are attended."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    if layout == "htd":
        k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
    b, hq, d = q.shape
    t, hkv = k.shape[1], k.shape[2]
    s = np.einsum("bkgd,btkd->bkgt", q.reshape(b, hkv, hq // hkv, d), k) * (1.0 / math.sqrt(d) if scaled else 1.0)
    valid = np.arange(t)[None, :] < np.asarray(lengths)[:, None]
    if window is not None:
        valid &= np.arange(t)[None, :] >= np.asarray(lengths)[:, None] - window
    s = np.where(valid[:, None, None, :], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bkgt,btkd->bkgd", p, v).reshape(b, hq, d)


def analyse(task: "Task", size: str = "cpu") -> DecodeShape | str:
    """The decode attention the reference computes at ``size`` (roles probed at ``cpu``), or why it is not one."""
    import jax

    from jaxbench.compare import compare_outputs
    from maxkernel.analysis.program import input_shapes, static_args

    shapes = input_shapes(task, size)
    options = _candidates(list(shapes))
    if not options:
        return "inputs are not one query token per sequence [batch, heads, dim], two caches and [batch] lengths"
    program = trace_program(task, size)
    if sum(1 for n in program.nodes if n.prim == "dot_general") != 2 or not any(n.prim == "exp" for n in program.nodes):
        return "not two products around a softmax"
    outs = jax.tree_util.tree_leaves(jax.eval_shape(lambda *a: task.reference(*a, **static_args(task, size)), *shapes))
    if len(outs) != 1 or tuple(outs[0].shape) != tuple(shapes[options[0].q].shape):
        return "the output is not one [batch, q_heads, head_dim] array"
    args, static = task.get_inputs(jax.random.key(0), "cpu")

    def run(statics: dict[str, Any]) -> np.ndarray | None:
        try:
            return np.asarray(jax.jit(lambda *a: task.reference(*a, **statics))(*args), np.float32)
        except Exception:  # a static the reference's shapes depend on: not a window, nothing to learn from it
            return None

    expected = run(static)
    assert expected is not None
    tol = task.spec.tolerance
    ints = [n for n, v in static.items() if isinstance(v, (int, np.integer)) and not isinstance(v, bool)]
    for option, at_cpu in zip(options, _candidates(list(args))):
        def agrees(window: str | None, statics: dict[str, Any], want: np.ndarray) -> bool:
            got = decode_attention(args[at_cpu.q], args[at_cpu.k], args[at_cpu.v], args[at_cpu.lengths],
                                   at_cpu.layout, at_cpu.scaled, None if window is None else int(statics[window]))
            return compare_outputs(got.astype(np.float32), want, tol.atol, tol.rtol).ok

        for window in (None, *ints):
            if agrees(window, static, expected) and all(
                    _holds(run, agrees, window, static, name, at_cpu.cache_len) for name in ints):
                return DecodeShape(**{**option.__dict__, "out_dtype": str(outs[0].dtype), "window": window})
    return "no reading of the inputs as decode attention matches the reference's output"


def _holds(run: Any, agrees: Any, window: str | None, static: dict[str, Any], name: str, cache_len: int) -> bool:
    """Whether the reading still matches the reference with the integer static ``name`` changed to a value
    that binds (a third of the cache): as the window when it is the window, unchanged output otherwise."""
    changed = {**static, name: max(1, cache_len // 3) if static[name] != max(1, cache_len // 3) else cache_len // 3 + 1}
    want = run(changed)
    return want is None or agrees(window, changed, want)


def vmem_bytes(a: DecodeShape, block_k: int) -> int:
    """Double-buffered k and v blocks (every kv head), the query and output blocks, the f32 accumulator, row
    statistics (lane-padded) and one block's f32 scores."""
    item = np.dtype(a.dtype).itemsize if a.dtype != "bfloat16" else 2
    cache = 2 * 2 * block_k * a.kv_heads * a.head_dim * item
    rows = max(a.q_heads, 8)
    return cache + 2 * rows * a.head_dim * (item + 4) + rows * a.head_dim * 4 + 4 * rows * 128 * 4 + 2 * rows * block_k * 4


class TpuDecodeTemplate:
    name = "tpu_decode_attention"
    description = ("decode attention over a contiguous KV cache: lengths by scalar prefetch, every kv head of a "
                   "cache block read once, online softmax, parallel splits of the cache combined in XLA")

    def applies(self, task: "Task", analysis: "TaskAnalysis") -> str | None:
        found = analyse(task, "cpu")
        return found if isinstance(found, str) else None

    def space(self, task: "Task", analysis: "TaskAnalysis", target: str) -> TemplateSpace:
        if not tpu_target(target):
            return TemplateSpace(defaults={}, space={"block_k": []})  # a TPU kernel (scalar prefetch, VMEM)
        a = analyse(task, "full")
        assert not isinstance(a, str)
        blocks = [bk for bk in TPU_BLOCKS_K if a.cache_len % bk == 0 and a.cache_len // bk >= 2
                  and vmem_bytes(a, bk) <= TPU_VMEM_BUDGET]
        if not blocks:
            return TemplateSpace(defaults={"block_k": 0}, space={"block_k": []})
        bk = blocks[-1]
        splits = [s for s in TPU_SPLITS if a.cache_len // bk >= 2 * s or s == 1]
        # Enough sequences fill the chip's cores on their own; a split adds a combine pass over the partials.
        default_split = 1 if a.batch >= 2 else max(splits)
        return TemplateSpace(defaults={"block_k": bk, "splits": default_split},
                             space={"block_k": blocks[-2:], "splits": splits})

    def render(self, task: "Task", params: dict[str, Any], sizes: tuple[str, ...]) -> str:
        found = [analyse(task, s) for s in sizes]
        bad = next((f for f in found if isinstance(f, str)), None)
        if bad is not None:
            raise EmitError(bad)
        first = found[0]
        assert not isinstance(first, str)
        if any(not isinstance(f, str) and (f.q, f.k, f.v, f.lengths, f.layout, f.scaled) !=
               (first.q, first.k, first.v, first.lengths, first.layout, first.scaled) for f in found):
            raise EmitError("the inputs play different roles at different sizes")
        return render_decode(task, first, int(params["block_k"]), int(params.get("splits", 1)))


def render_decode(task: "Task", a: DecodeShape, block_k: int, splits: int) -> str:
    names = arg_names(task)
    q, k, v, lengths = (names[i] for i in (a.q, a.k, a.v, a.lengths))
    precision = ", precision=jax.lax.Precision.HIGHEST" if a.dtype == "float32" else ""
    scale = "1.0 / math.sqrt(head_dim)" if a.scaled else "1.0"
    if a.layout == "thd":
        cache_len, kv_heads = f"{k}.shape[1]", f"{k}.shape[2]"
        slab = (f"    k_slab = {k}.reshape({k}.shape[0], {k}.shape[1], -1)  # [batch, cache_len, kv_heads * head_dim]: "
                f"a free reshape\n    v_slab = {v}.reshape({v}.shape[0], {v}.shape[1], -1)\n")
        cache_spec = "pl.BlockSpec((1, block_k, kv_heads * head_dim), lambda b, s, j, lens: (b, _valid_block(b, s, j, lens), 0))"
        head_slice = "{ref}[0, :, h * head_dim:(h + 1) * head_dim]"
    else:
        cache_len, kv_heads = f"{k}.shape[2]", f"{k}.shape[1]"
        slab = f"    k_slab, v_slab = {k}, {v}\n"
        cache_spec = "pl.BlockSpec((1, kv_heads, block_k, head_dim), lambda b, s, j, lens: (b, 0, _valid_block(b, s, j, lens), 0))"
        head_slice = "{ref}[0, h]"
    if a.window is None:
        window_param, window_arg, window_line = "", "", ""
        start_k, start_map = "0", "0"
        valid = "position < length"
        span = "blocks"
    else:
        window_param, window_arg = ", window", ", window=window"
        window_line = f'    window = static["{a.window}"]  # only the last `window` valid positions are attended\n'
        start_k = "jnp.maximum(length - window, 0) // block_k  # the block where the window starts"
        start_map = "jnp.maximum(lens[b] - window, 0) // block_k"
        valid = "(position < length) & (position >= length - window)"
        span = "min(blocks, -(-window // block_k) + 1)  # the blocks one window can touch"
    return f'''"""{task.id}: {TpuDecodeTemplate.description}.

Generated by MaxKernel's rules brain: {block_k} cache positions a step, {splits} split{'s' if splits > 1 else ''} of the cache per sequence.
"""

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK_K = {block_k}  # cache positions per grid step (every kv head)
SPLITS = {splits}  # parallel ranges of the cache per sequence, combined in XLA
MASK_VALUE = -1e30  # a masked score: finite, so no inf - inf
M_START = -1e20  # the running max starts above MASK_VALUE


def _fit(block, extent):
    """The block, halved until it divides the extent (the whole extent when that is smaller)."""
    block = min(block, extent)
    while extent % block:
        block //= 2
    return block


def _decode_kernel(lengths_ref, q_ref, k_ref, v_ref, o_ref, m_out, l_out, m_ref, l_ref, acc_ref, *,
                   kv_heads, head_dim, block_k, blocks_per_split, scale{window_param}):
    b, s, j = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    length = lengths_ref[b]
    start = {start_k}
    block = start + s * blocks_per_split + j

    @pl.when(j == 0)
    def _init():
        m_ref[...] = jnp.full(m_ref.shape, M_START, jnp.float32)
        l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    @pl.when(block * block_k < length)
    def _step():
        q = q_ref[0]  # [q_heads, head_dim]: every query head of the sequence
        q_heads = q.shape[0]
        group = q_heads // kv_heads
        row = jax.lax.broadcasted_iota(jnp.int32, (q_heads, 1), 0)
        position = block * block_k + jax.lax.broadcasted_iota(jnp.int32, (1, block_k), 1)
        scores = jnp.full((q_heads, block_k), MASK_VALUE, jnp.float32)
        for h in range(kv_heads):  # kv head h serves query rows [h * group, (h + 1) * group)
            k_h = {head_slice.format(ref="k_ref")}
            s_h = jax.lax.dot_general(q, k_h, (((1,), (1,)), ((), ())),
                                      preferred_element_type=jnp.float32{precision}) * scale
            scores = jnp.where((row >= h * group) & (row < (h + 1) * group), s_h, scores)
        scores = jnp.where({valid}, scores, MASK_VALUE)
        m_prev = m_ref[...]
        m_new = jnp.maximum(m_prev, jnp.max(scores, axis=1, keepdims=True))
        p = jnp.exp(scores - m_new)
        alpha = jnp.exp(m_prev - m_new)
        l_ref[...] = alpha * l_ref[...] + jnp.sum(p, axis=1, keepdims=True)
        mixed = jnp.zeros(acc_ref.shape, jnp.float32)
        for h in range(kv_heads):
            v_h = {head_slice.format(ref="v_ref")}
            o_h = jax.lax.dot_general(p.astype(v_h.dtype), v_h, (((1,), (0,)), ((), ())),
                                      preferred_element_type=jnp.float32{precision})
            mixed = jnp.where((row >= h * group) & (row < (h + 1) * group), o_h, mixed)
        acc_ref[...] = alpha * acc_ref[...] + mixed
        m_ref[...] = m_new

    @pl.when(j == pl.num_programs(2) - 1)
    def _write():
        o_ref[0, 0] = acc_ref[...]
        m_out[0, 0] = m_ref[...]
        l_out[0, 0] = l_ref[...]


def kernel({", ".join(names)}, **static):
    batch, q_heads, head_dim = {q}.shape
    cache_len, kv_heads = {cache_len}, {kv_heads}
    block_k = _fit(BLOCK_K, cache_len)
{window_line}    blocks = cache_len // block_k
    span = {span}
    splits = min(SPLITS, span)
    blocks_per_split = -(-span // splits)

    def _valid_block(b, s, j, lens):
        # Past the length (or the cache), repeat the last block that holds keys: the pipeline skips the copy.
        last = jnp.maximum((lens[b] + block_k - 1) // block_k - 1, 0)
        return jnp.minimum(jnp.minimum({start_map} + s * blocks_per_split + j, blocks - 1), last)

{slab}    rows = pl.BlockSpec((1, 1, q_heads, head_dim), lambda b, s, j, lens: (b, s, 0, 0))
    stats = pl.BlockSpec((1, 1, q_heads, 1), lambda b, s, j, lens: (b, s, 0, 0))
    acc, m, l = pl.pallas_call(
        functools.partial(_decode_kernel, kv_heads=kv_heads, head_dim=head_dim, block_k=block_k,
                          blocks_per_split=blocks_per_split, scale={scale}{window_arg}),
        out_shape=(jax.ShapeDtypeStruct((batch, splits, q_heads, head_dim), jnp.float32),
                   jax.ShapeDtypeStruct((batch, splits, q_heads, 1), jnp.float32),
                   jax.ShapeDtypeStruct((batch, splits, q_heads, 1), jnp.float32)),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=(batch, splits, blocks_per_split),
            in_specs=[pl.BlockSpec((1, q_heads, head_dim), lambda b, s, j, lens: (b, 0, 0)),
                      {cache_spec},
                      {cache_spec}],
            out_specs=[rows, stats, stats],
            scratch_shapes=[pltpu.VMEM((q_heads, 1), jnp.float32), pltpu.VMEM((q_heads, 1), jnp.float32),
                            pltpu.VMEM((q_heads, head_dim), jnp.float32)],
        ),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
    )({lengths}.astype(jnp.int32), {q}, k_slab, v_slab)
    # The splits' partial results, each under its own running max, combined into one softmax.
    top = jnp.max(m, axis=1, keepdims=True)
    weight = jnp.exp(m - top)
    out = jnp.sum(acc * weight, axis=1) / jnp.sum(l * weight, axis=1)
    return out.astype(jnp.{a.out_dtype})
'''


TPU_DECODE = TpuDecodeTemplate()
