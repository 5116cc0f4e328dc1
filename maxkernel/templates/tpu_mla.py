"""TPU multi-head latent attention (MLA, DeepSeek style): the projections in XLA, the attention in Pallas.

For a reference that projects ``x`` through RMS-normalised low-rank latents to per-head queries and
keys/values, splits each query/key head into a plain part and a RoPE part (one RoPE key per token shared by
every head), and runs causal softmax attention whose q·k head dimension (plain + RoPE) differs from the value
head dimension, then projects the heads back to the hidden size. What an expert writes:
- the projections as bf16 MXU products with f32 accumulation (the weights are stored bf16: the product of
  bf16 values is exact in f32); a product of an f32 latent (after its RMS norm) by a weight in two passes,
  its high and low bf16 parts, since rounding the latent to bf16 is outside the tolerance on shifted inputs;
  the RMS norms and the rotation in f32;
- the scores as the 3-pass split of f32 q and k (``SCORE_PASSES``), the probabilities and values in bf16;
- the attention as the flash kernel of ``templates.attention`` (``render_flash``): the causal schedule visits
  only the key blocks at or before each query block, the softmax statistics stay in VMEM, the output is
  normalised once; its value head dimension is read from ``v``, so q·k heads of plain + RoPE width and value
  heads of another width share one body;
- no [heads, seq, seq] score tensor in HBM (the reference's dominant traffic).
The template is matched by what the reference computes: its program's structure (eight inputs, a softmax, a
rotation, two RMS norms), the inputs' roles and the layer's sizes from their shapes in any order and under
any names, and the reference's output at its cpu shapes against this computation in float64 (which also
tells which numeric statics are the norms' epsilon and the RoPE base).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from maxkernel.analysis.program import arg_names, input_shapes, static_args, trace_program
from maxkernel.templates.attention import FlashPlan, render_flash
from maxkernel.templates.base import TPU_VMEM_BUDGET, TemplateSpace, analysed_at, block_pair_space, tpu_target
from maxkernel.templates.masks import CAUSAL
from maxkernel.templates.tpu_gemm import SPLIT_SOURCE

if TYPE_CHECKING:
    from jaxbench.task import Task
    from maxkernel.analysis import TaskAnalysis

TPU_BLOCKS_Q = (128, 256, 512, 1024)
TPU_BLOCKS_K = (128, 256, 512, 1024, 2048)
ROLES = ("x", "wq_a", "q_norm", "wq_b", "wkv_a", "kv_norm", "wkv_b", "wo")
SIGNATURE = frozenset({"dot_general", "rsqrt", "exp", "reduce_max", "cos", "sin"})
PROBE_TOLERANCE = 3e-2  # bf16 output of bf16 inputs
MAX_READINGS = 8  # role assignments the shapes leave open, each confirmed by a probe
# The scores' bf16 passes: q and k are f32 values (projections of normalised latents) whose bf16 rounding
# moves large scores outside a bf16 task's tolerance on shifted inputs (measured: 773 of 524288 outputs at
# the cpu size); their high and low parts, laid side by side along the head, make one bf16 product the
# 3-pass split q_hi k_hi + q_lo k_hi + q_hi k_lo.
SCORE_PASSES = 3


@dataclass
class MlaShape:
    batch: int
    seq: int
    heads: int
    qk_dim: int  # plain + RoPE, times three: the high and low bf16 parts of the 3-pass score product
    v_dim: int
    names: tuple[str, ...]  # the reference's inputs in ``ROLES`` order
    constants: tuple[str, str]  # the RMS norms' epsilon and the RoPE base: a static's name or a literal
    units: bool = False  # every argument and the output carry a leading axis of one (the layer under a vmap)


@dataclass(frozen=True)
class Dims:
    """The layer's sizes, all read from its weights' shapes."""

    hidden: int
    q_lora: int
    kv_lora: int
    heads: int
    nope: int
    rope: int
    v: int


def dims(shapes: list[tuple[int, ...]]) -> Dims | None:
    """The sizes the weights (in ``ROLES`` order) imply, or None when they are not one MLA layer's: the
    key's RoPE width is what ``wkv_a`` holds past the value latent; heads x plain, heads x RoPE and heads x
    value widths follow from the three head projections' widths."""
    x, wq_a, q_norm, wq_b, wkv_a, kv_norm, wkv_b, wo = shapes
    if len(x) != 3 or any(len(w) != 2 for w in (wq_a, wq_b, wkv_a, wkv_b, wo)) or len(q_norm) != 1 or len(kv_norm) != 1:
        return None
    hidden, q_lora, kv_lora = x[2], q_norm[0], kv_norm[0]
    rope = wkv_a[1] - kv_lora
    if wq_a != (hidden, q_lora) or wkv_a[0] != hidden or rope <= 0 or wq_b[0] != q_lora or wkv_b[0] != kv_lora \
            or wo[1] != hidden:
        return None
    heads_rope = wq_b[1] - wkv_b[1] + wo[0]  # H(n + r) - H(n + v) + H v
    if heads_rope <= 0 or heads_rope % rope:
        return None
    heads = heads_rope // rope
    if (wkv_b[1] - wo[0]) % heads or wo[0] % heads:
        return None
    nope, v = (wkv_b[1] - wo[0]) // heads, wo[0] // heads
    if nope <= 0 or v <= 0 or rope % 2:
        return None
    return Dims(hidden, q_lora, kv_lora, heads, nope, rope, v)


def _units(shapes: list[tuple[int, ...]], out: tuple[int, ...]) -> bool:
    """Whether every argument and the output lead with an axis of one that the layer does not read (one
    layer mapped over a batch of one): the layer is then read without it."""
    return bool(out) and out[0] == 1 and all(len(s) >= 2 and s[0] == 1 for s in shapes)


def _readings(program: Any) -> list[tuple[int, ...]]:
    """The assignments of the inputs (positions in ``ROLES`` order) whose shapes make one MLA layer with the
    output shaped like ``x`` (the shapes without a leading unit axis every one carries, see ``_units``)."""
    from itertools import permutations

    shapes = [tuple(int(d) for d in v.shape) for v in program.inputs]
    out = tuple(getattr(program.outputs[0], "shape", ()))
    if _units(shapes, out):
        shapes, out = [s[1:] for s in shapes], out[1:]
    found = []
    for order in permutations(range(8)):
        placed = [shapes[i] for i in order]
        if placed[0] == out and dims(placed) is not None:
            found.append(order)
            if len(found) > MAX_READINGS:
                break
    return found


def analyse(task: "Task", size: str) -> MlaShape | str:
    """The MLA layer's shape at ``size``, or why the reference is not one. Roles come from the inputs'
    shapes in any order, the sizes from the weights, the epsilon and RoPE base from the numeric statics;
    what shapes and names leave open is settled by the numeric probe."""
    program = trace_program(task, size).dce()
    if len(program.inputs) != 8 or len(program.outputs) != 1:
        return "not eight inputs (x, six weights and two norm vectors) and one output"
    if not SIGNATURE <= set(program.primitives()):
        return "not a softmax attention with RoPE and RMS norms"
    readings = _readings(program)
    if not readings or len(readings) > MAX_READINGS:
        return "inputs not shaped as x, the query and key/value latent projections, their norms and the output projection"
    found = _confirmed(task, readings, _literals(program))
    if found is None:
        return "the reference is not the latent attention layer this template computes"
    order, constants = found
    placed = [program.inputs[i] for i in order]
    units = _units([tuple(int(n) for n in v.shape) for v in program.inputs], tuple(program.outputs[0].shape))
    shapes = [tuple(int(n) for n in v.shape)[1 if units else 0:] for v in placed]
    d = dims(shapes)
    assert d is not None
    return MlaShape(shapes[0][0], shapes[0][1], d.heads, SCORE_PASSES * (d.nope + d.rope), d.v,
                    tuple(v.name for v in placed), constants, units)


def _rms(t: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return t / np.sqrt(np.mean(t * t, axis=-1, keepdims=True) + eps) * w


def _rotate(t: np.ndarray, theta: float) -> np.ndarray:
    """Interleaved RoPE on [batch, seq, heads, dim]: pair (2i, 2i+1) of token p turns by p * theta^(-2i/dim)."""
    dim = t.shape[-1]
    angle = np.arange(t.shape[1])[:, None] * theta ** (-np.arange(0, dim, 2) / dim)[None, :]
    cos, sin = np.cos(angle)[None, :, None, :], np.sin(angle)[None, :, None, :]
    a, b = t[..., 0::2], t[..., 1::2]
    return np.stack([a * cos - b * sin, a * sin + b * cos], axis=-1).reshape(t.shape)


def mla(weights: list[np.ndarray], heads: int, nope: int, rope: int, dv: int, theta: float, eps: float) -> np.ndarray:
    """The computation this template writes, in float64 numpy: what the reference is confirmed against."""
    x, wq_a, q_norm, wq_b, wkv_a, kv_norm, wkv_b, wo = weights
    batch, seq, _ = x.shape
    lora = kv_norm.shape[0]
    q = (_rms(x @ wq_a, q_norm, eps) @ wq_b).reshape(batch, seq, heads, nope + rope)
    kv_a = x @ wkv_a
    kv = (_rms(kv_a[..., :lora], kv_norm, eps) @ wkv_b).reshape(batch, seq, heads, nope + dv)
    k_pe = _rotate(kv_a[..., lora:][:, :, None, :], theta)
    q = np.concatenate([q[..., :nope], _rotate(q[..., nope:], theta)], axis=-1)
    k = np.concatenate([kv[..., :nope], np.broadcast_to(k_pe, (batch, seq, heads, rope))], axis=-1)
    s = np.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(nope + rope)
    s = np.where(np.tril(np.ones((seq, seq), bool)), s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p = p / p.sum(axis=-1, keepdims=True)
    return np.einsum("bhqk,bkhd->bqhd", p, kv[..., nope:]).reshape(batch, seq, heads * dv) @ wo


def _literals(program: Any) -> dict[str, float]:
    """The program's positive scalar float literals, by their source text: where an epsilon or a RoPE base
    written into the reference as a constant (not passed as a static) is found."""
    from maxkernel.analysis.program import Const

    found: dict[str, float] = {}
    for node in program.nodes:
        for op in node.ins:
            if isinstance(op, Const) and not op.shape and np.issubdtype(np.dtype(op.dtype), np.floating):
                value = float(np.asarray(op.value))
                if value > 0 and math.isfinite(value):  # the shortest text of the value at its own precision
                    found.setdefault(str(np.asarray(op.value, np.dtype(op.dtype)).item() if np.dtype(op.dtype) == np.float64
                                         else np.float32(value)), value)
    return found


_CONFIRMED: dict[tuple[str, str], tuple[tuple[int, ...], tuple[str, str]] | None] = {}


def _confirmed(task: "Task", readings: list[tuple[int, ...]],
               literals: dict[str, float]) -> tuple[tuple[int, ...], tuple[str, str]] | None:
    """The reading and the (epsilon, RoPE base), each a static's name or a literal's text, under which the
    reference, run at its ``cpu`` shapes on a draw of its own, is ``mla`` within bf16 rounding (probed once
    per task)."""
    key = (str(task.path), task.source_digest)
    if key not in _CONFIRMED:
        _CONFIRMED[key] = _probe(task, readings, literals)
    found = _CONFIRMED[key]
    return found if found is not None and found[0] in readings else None


def _probe(task: "Task", readings: list[tuple[int, ...]],
           literals: dict[str, float]) -> tuple[tuple[int, ...], tuple[str, str]] | None:
    from itertools import permutations

    import jax
    import jax.numpy as jnp

    static = static_args(task, "cpu")
    values = {k: float(v) for k, v in static.items() if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0}
    values.update((text, value) for text, value in literals.items() if text not in values)  # statics first
    shapes = [tuple(int(d) for d in s.shape) for s in input_shapes(task, "cpu")]
    dtype = np.dtype(input_shapes(task, "cpu")[0].dtype)
    out = tuple(jax.eval_shape(lambda *a: task.reference(*a, **static), *input_shapes(task, "cpu")).shape)
    units = _units(shapes, out)
    shapes = [s[1:] for s in shapes] if units else shapes
    reference = jax.jit(lambda *a: task.reference(*a, **static))
    for order in readings:
        placed = [shapes[i] for i in order]
        d = dims(placed)
        assert d is not None
        rng = np.random.default_rng(0)
        fan_in = [0, d.hidden, -1, d.q_lora, d.hidden, -1, d.kv_lora, d.heads * d.v]
        roles = [rng.standard_normal(s) if f == 0 else (1.0 + 0.1 * rng.standard_normal(s)) if f < 0
                 else rng.standard_normal(s) / math.sqrt(f) for s, f in zip(placed, fan_in)]
        inputs: list[Any] = [None] * 8
        for role, position in enumerate(order):
            inputs[position] = jnp.asarray(roles[role], jnp.float32).astype(dtype)
        weights = [np.asarray(inputs[position], np.float64) for position in order]
        if units:
            inputs = [a[None] for a in inputs]
        try:
            got = np.asarray(reference(*inputs), np.float64)
            got = got[0] if units else got
        except Exception:  # the reference reads its inputs otherwise: not this reading
            continue
        for eps, theta in permutations(values, 2):
            if not 0 < values[eps] < 1e-2 or values[theta] <= 2:
                continue
            expected = mla(weights, d.heads, d.nope, d.rope, d.v, values[theta], values[eps])
            if got.shape == expected.shape and np.allclose(got, expected, rtol=PROBE_TOLERANCE, atol=PROBE_TOLERANCE):
                return order, (eps, theta)
    return None


def vmem_bytes(a: MlaShape, block_q: int, block_k: int) -> int:
    """VMEM of one attention step: double-buffered bf16 q, k, v and output blocks, the f32 accumulator and
    the lane-padded row statistics, one block of f32 scores and probabilities."""
    blocks = 2 * 2 * (block_q * (a.qk_dim + a.v_dim) + block_k * (a.qk_dim + a.v_dim))
    return blocks + block_q * a.v_dim * 4 + 2 * block_q * 128 * 4 + 2 * block_q * block_k * 4


class TpuMlaTemplate:
    name = "tpu_mla"
    description = ("latent attention: bf16 projections in XLA, causal flash attention over q·k heads of "
                   "plain + RoPE width and value heads of their own width")

    def applies(self, task: "Task", analysis: "TaskAnalysis") -> str | None:
        found = analyse(task, "cpu")
        return found if isinstance(found, str) else None

    def space(self, task: "Task", analysis: "TaskAnalysis", target: str) -> TemplateSpace:
        empty = TemplateSpace(defaults={"block_q": 0, "block_k": 0}, space={"block_q": [], "block_k": []})
        if not tpu_target(target):
            return empty  # a TPU kernel: scalar-prefetched schedule
        a = analyse(task, "full")
        if isinstance(a, str):
            return empty
        found = block_pair_space(a.seq, TPU_BLOCKS_Q, TPU_BLOCKS_K,
                                 lambda bq, bk: vmem_bytes(a, bq, bk) <= TPU_VMEM_BUDGET)
        if found is None:
            return empty
        (bq, bk), space = found
        return TemplateSpace(defaults={"block_q": bq, "block_k": bk}, space=space)

    def render(self, task: "Task", params: dict[str, Any], sizes: tuple[str, ...]) -> str:
        found = analysed_at(task, sizes, analyse, lambda s: (s.names, s.constants))
        return render_mla(task, found[0], int(params["block_q"]), int(params["block_k"]))


def render_mla(task: "Task", a: MlaShape, block_q: int, block_k: int) -> str:
    names = arg_names(task)[:8]
    x, wq_a, q_norm, wq_b, wkv_a, kv_norm, wkv_b, wo = a.names  # the reference's own names, by role
    static = list(static_args(task, "cpu"))
    eps, theta = a.constants
    units_in = ("\n    # One layer under a leading axis of one on every argument: computed without it, put back after."
                f"\n    {', '.join(names)} = ({', '.join(n + '[0]' for n in names)})") if a.units else ""
    units_out = "[None]" if a.units else ""
    doc = (f'"""{task.id}: {TPU_MLA.description}.\n\n'
           "The query and key/value latents, their RMS norms and the interleaved rotation of the RoPE parts\n"
           "run in XLA (bf16 products, f32 accumulation); each query head is its plain part and its rotated\n"
           "part, each key head its plain part and the token's shared rotated key. The causal attention is a\n"
           "flash kernel over the visible (query block, key block) pairs whose value heads are their own width.\n"
           "Generated by MaxKernel's rules brain.\n"
           '"""\n')
    plan = FlashPlan(CAUSAL, f"1.0 / math.sqrt(head_dim // {SCORE_PASSES})", np.dtype("bfloat16"),
                     np.dtype("bfloat16"), ())
    attention = render_flash(task, plan, block_q, block_k, names=["q", "k", "v"], entry="_attention", doc=doc)
    return attention + f'''

def _mm(a, w):
    """``a @ w`` on the MXU: operands in the weight's dtype, accumulated in f32."""
    return jax.lax.dot_general(a.astype(w.dtype), w, (((a.ndim - 1,), (0,)), ((), ())),
                               preferred_element_type=jnp.float32)


{SPLIT_SOURCE}

def _mm_f32(a, w):
    """``a @ w`` for an f32 ``a`` and a bf16 ``w``: two bf16 passes, the high and the low part of ``a``."""
    hi, lo = _split(a)
    return _mm(hi, w) + _mm(lo, w)


def _rms_norm(t, weight, eps):
    return t * jax.lax.rsqrt(jnp.mean(jnp.square(t), axis=-1, keepdims=True) + eps) * weight.astype(jnp.float32)


def _rotate(t, theta):
    """Interleaved RoPE on [batch, seq, heads, dim]: pair (2i, 2i+1) of token p turns by p * theta^(-2i/dim)."""
    dim = t.shape[-1]
    inv_freq = theta ** (-jnp.arange(0, dim, 2, dtype=jnp.float32) / dim)
    angle = jnp.arange(t.shape[1], dtype=jnp.float32)[:, None] * inv_freq[None, :]
    cos, sin = jnp.cos(angle)[None, :, None, :], jnp.sin(angle)[None, :, None, :]
    pairs = t.reshape(t.shape[:-1] + (dim // 2, 2))
    a, b = pairs[..., 0], pairs[..., 1]
    return jnp.stack([a * cos - b * sin, a * sin + b * cos], axis=-1).reshape(t.shape)


def kernel({", ".join(names)}, *, {", ".join(static)}):{units_in}
    batch, seq, _ = {x}.shape
    # The layer's sizes, from its weights: the key's RoPE width is what {wkv_a} holds past the value latent;
    # heads x (plain + RoPE), heads x (plain + value) and heads x value are the head projections' widths.
    lora = {kv_norm}.shape[0]
    rope = {wkv_a}.shape[1] - lora
    heads = ({wq_b}.shape[1] - {wkv_b}.shape[1] + {wo}.shape[0]) // rope
    nope, dv = ({wkv_b}.shape[1] - {wo}.shape[0]) // heads, {wo}.shape[0] // heads
    q = _mm_f32(_rms_norm(_mm({x}, {wq_a}), {q_norm}, {eps}), {wq_b}).reshape(batch, seq, heads, nope + rope)
    kv_a = _mm({x}, {wkv_a})
    kv = _mm_f32(_rms_norm(kv_a[..., :lora], {kv_norm}, {eps}), {wkv_b}).reshape(batch, seq, heads, nope + dv)
    k_pe = _rotate(kv_a[..., lora:][:, :, None, :], {theta})  # one rotated key per token, shared by the heads
    q = jnp.concatenate([q[..., :nope], _rotate(q[..., nope:], {theta})], axis=-1)
    k = jnp.concatenate([kv[..., :nope], jnp.broadcast_to(k_pe, (batch, seq, heads, rope))], axis=-1)

    (q_hi, q_lo), (k_hi, k_lo) = _split(q), _split(k)

    def heads_first(t):
        return jnp.swapaxes(t, 1, 2).astype(jnp.bfloat16)

    # [q_hi, q_lo, q_hi] . [k_hi, k_hi, k_lo]: the 3-pass score product as one bf16 product.
    q3 = heads_first(jnp.concatenate([q_hi, q_lo, q_hi], axis=-1))
    k3 = heads_first(jnp.concatenate([k_hi, k_hi, k_lo], axis=-1))
    o = _attention(q3, k3, heads_first(kv[..., nope:]))  # [batch, heads, seq, v]
    o = jnp.swapaxes(o, 1, 2).reshape(batch, seq, heads * dv)
    return _mm(o, {wo}).astype({x}.dtype){units_out}
'''


TPU_MLA = TpuMlaTemplate()
