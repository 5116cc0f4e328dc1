"""A channels-last 1-D convolution, any stride, as row GEMMs: the TPU convolution template's kernel for it.

What an expert writes for ``epilogue(conv1d(x, w))`` with ``x`` [batch, length, channels] (a strided stem of
an audio or byte model, a dense short convolution):
- the input's length is split into its stride phases by a free reshape, [batch, length / s, s x channels]:
  output position ``t`` reads input ``s t + k d - low`` through tap ``k``, which is phase row ``t + e`` at
  lanes ``r C ... (r + 1) C`` with ``e, r = divmod(k d - low, s)``. Every tap is then a unit-stride window of
  rows, so no strided slice is ever taken;
- taps of one phase row whose phases follow each other read adjacent lanes, and are one MXU product over
  their lanes together against their weights stacked on the contraction (a stride-2 width-3 kernel: two
  products, not three);
- the grid steps over blocks of ``BLOCK_ROWS`` output positions of each sample (and ``BLOCK_N`` output
  channels); a step reads its rows and the halo past them as an element-offset window of the phase-split
  input (``pl.Element``, overlapping windows, no copy), padded past both ends;
- rows of a window outside the input are the convolution's zero padding: only the steps whose window
  reaches past an end mask them (``pl.when``), the others multiply as read;
- the products accumulate in f32 in registers and VMEM, and the reference's elementwise tail with its
  per-channel operands (a bias) runs on the tile before the one write, in the reference's layout; any other
  tail runs in XLA on the convolution's output.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from maxkernel.analysis.graph import ELEMENTWISE
from maxkernel.analysis.program import Node, Program, Var

if TYPE_CHECKING:
    from maxkernel.templates.tpu_conv import ConvPlan

CHANNELS_LAST = (0, 2, 1)  # (batch, feature, spatial) positions of an NWC array
LANES = 128
TPU_BLOCKS_ROWS = (256, 512, 1024, 2048)
TPU_BLOCKS_N = (128, 256, 512, 1024)


@dataclass(frozen=True)
class RowsConv:
    """A channels-last 1-D convolution's geometry: the kernel's width, stride, dilation and padding, and the
    kernel's layout (``rhs_spec``: positions of its out-feature, in-feature and spatial axes)."""

    taps: int
    stride: int
    dilation: int
    low: int
    high: int
    rhs_spec: tuple[int, int, int]
    # Where the padding depends on the input's length ("SAME" pads by what the stride leaves over): (low, high)
    # for each length modulo the stride, read from the reference at one length of every residue. Empty: the
    # padding is (low, high) at every length.
    by_residue: tuple[tuple[int, int], ...] = ()

    def paddings(self) -> tuple[tuple[int, int], ...]:
        """Every padding the convolution may use: one per residue of the length, or its one padding."""
        return self.by_residue or ((self.low, self.high),)


def rows_conv(conv: Node) -> RowsConv | str | None:
    """The geometry of a 1-D convolution whose input and output are channels-last, why such a convolution
    is not served, or None when the layout is another (the channels-first template's reasons apply)."""
    p = conv.params
    dn = p["dimension_numbers"]
    if tuple(dn.lhs_spec) != CHANNELS_LAST or tuple(dn.out_spec) != CHANNELS_LAST:
        return None
    if int(p["feature_group_count"]) != 1 or int(p["batch_group_count"]) != 1:
        return "a grouped 1-D convolution"
    if int(p["lhs_dilation"][0]) != 1:
        return "a transposed 1-D convolution (a dilated input)"
    (low, high), = p["padding"]
    if int(low) < 0 or int(high) < 0:
        return "negative padding"
    w = conv.ins[1]
    spec = tuple(int(d) for d in dn.rhs_spec)
    return RowsConv(int(w.shape[spec[2]]), int(p["window_strides"][0]), int(p["rhs_dilation"][0]), int(low), int(high),
                    (spec[0], spec[1], spec[2]))


def per_channel_tail(tail: Program, others: list[Var], o: int, out_shape: tuple[int, ...], program: Program) -> bool:
    """Whether the tail runs on an output tile alone: elementwise, shaped like the convolution's output, and
    every other operand of it [..., channels] with only the channels (a bias), broadcast along the last axis."""
    if tuple(program.outputs[0].shape) != tuple(out_shape):
        return False
    if not all(nd.prim in ELEMENTWISE or nd.prim == "broadcast_in_dim" for nd in tail.nodes):
        return False
    users = tail.users()
    for v in others:
        if not v.shape or int(v.shape[-1]) != o or int(np.prod(v.shape)) != o or not users.get(v):
            return False
        for node in users[v]:
            shape, dims = tuple(node.params.get("shape", ())), tuple(node.params.get("broadcast_dimensions", ()))
            if node.prim != "broadcast_in_dim" or shape[:-1] != (1,) * (len(shape) - 1) or dims[-1:] != (len(shape) - 1,):
                return False
    return True


def _tap_groups(taps, stride, dilation, low, channels):  # type: ignore[no-untyped-def]
    """Where each tap reads in a window of the phase-split input, merged: tap ``k`` reads phase row
    ``t + e`` at lanes ``r C ... (r + 1) C``, ``e, r = divmod(k dilation - low, stride)``. Taps of one row
    offset whose phases follow each other are one product over their lanes, against their weights' rows.
    Returns the first window row's offset ``e`` (the halo before the output's rows), the last one's, and
    per product (window row offset, first lane, lanes, first weight row)."""
    reads = [divmod(k * dilation - low, stride) for k in range(taps)]
    first, last = min(e for e, _ in reads), max(e for e, _ in reads)
    groups = []
    for k, (e, r) in enumerate(reads):
        if groups and k > 0 and reads[k - 1] == (e, r - 1):
            row, lane, lanes, weight = groups[-1]
            groups[-1] = (row, lane, lanes + channels, weight)
        else:
            groups.append((e - first, r * channels, channels, k * channels))
    return first, last, tuple(groups)


TAP_GROUPS_SOURCE = inspect.getsource(_tap_groups).replace("  # type: ignore[no-untyped-def]", "") + "\n"


def served(p: "ConvPlan") -> str | None:
    """Why the kernel cannot take this convolution (None when it can): a strided one splits its channels into
    phases on lanes, which must then be whole lane tiles."""
    assert p.rows is not None
    if p.rows.stride > 1 and p.c % LANES:
        return f"a strided 1-D convolution over {p.c} channels (the stride's phases need whole 128-lane tiles)"
    return None


def _round_up(a: int, b: int) -> int:
    return -(-a // b) * b


def window_rows(p: "ConvPlan", block_rows: int) -> int:
    """Rows of a step's window: its output rows and the halo the taps reach (the widest over the paddings
    the length may call for), in whole 16-row tiles."""
    r = p.rows
    assert r is not None
    halo = max(last - first for first, last, _ in (_tap_groups(r.taps, r.stride, r.dilation, low, p.c)
                                                   for low, _ in r.paddings()))
    return _round_up(block_rows + halo, 16)


def rows_vmem_bytes(p: "ConvPlan", block_rows: int, block_n: int, passes: int) -> int:
    """VMEM a step plans for: the double-buffered window, weights and output tile, the window masked at an
    edge, the f32 accumulator and one product's operand, and their bf16 halves when split in three passes."""
    assert p.rows is not None
    item = p.in_dtype.itemsize
    lanes = p.rows.stride * p.c
    span = window_rows(p, block_rows)
    out_item = np.dtype(p.out.dtype).itemsize if p.tileable else 4
    width = _round_up(block_n, LANES)
    blocks = 2 * (span * _round_up(lanes, LANES) * item + p.rows.taps * p.c * width * item + block_rows * width * out_item)
    values = span * _round_up(lanes, LANES) * item + 2 * block_rows * width * 4 + block_rows * _round_up(lanes, LANES) * 4
    split = 2 * 2 * (block_rows * _round_up(lanes, LANES) + p.rows.taps * p.c * width) if passes == 3 else 0
    return blocks + values + split


def rows_space(p: "ConvPlan", cap: int, passes: list[int]) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """Defaults and space: output channels whole when they fit (the window is read once per sample and rows),
    the most rows a step whose VMEM fits, and half of each beside it."""
    worst = min(passes)
    out = p.out_spatial[0]
    rows_options = sorted({b for b in TPU_BLOCKS_ROWS if b < out} | ({out} if out <= TPU_BLOCKS_ROWS[-1] else set()))
    n_options = sorted({b for b in TPU_BLOCKS_N if p.o % b == 0 and b < p.o} | {p.o})
    fits = [(bn, br) for bn in n_options for br in rows_options if rows_vmem_bytes(p, br, bn, worst) <= cap]
    if not fits:
        return {"block_rows": 0}, {"block_rows": []}
    bn, br = max(fits)
    legal = set(fits)
    space: dict[str, list[Any]] = {
        "block_rows": sorted({br} | ({b for b in rows_options if b == br // 2 and (bn, b) in legal})),
        "block_n": sorted({bn} | ({b for b in n_options if b == bn // 2 and (b, br) in legal})),
        "passes": passes,
    }
    return {"block_rows": br, "block_n": bn, "passes": worst}, space


def rows_constants(p: "ConvPlan", params: dict[str, Any], passes: int) -> str:
    return "\n".join([
        f"BLOCK_ROWS = {int(params['block_rows'])}  # output positions per step (the tile's rows)",
        f"BLOCK_N = {int(params['block_n'])}  # output channels per step (the tile's lanes)",
        f"VMEM_LIMIT_BYTES = {vmem_limit(p, params, passes)}  # a step's blocks and values, and half again",
    ]) + "\n"


def rows_geometry(p: "ConvPlan") -> str:
    assert p.rows is not None
    r = p.rows
    lines = [f"WIDTH, STRIDE, DILATION = {r.taps}, {r.stride}, {r.dilation}  # the reference's kernel width, stride and dilation"]
    if r.by_residue:
        lines += ["# The zero padding it convolves with, (before, after) the input, for each input length modulo STRIDE",
                  "# (the reference pads by what the stride leaves over).",
                  f"PADDING = {r.by_residue!r}"]
    else:
        lines.append(f"PAD_LOW, PAD_HIGH = {r.low}, {r.high}  # the zero padding it convolves with, before and after the input")
    return "\n".join(lines) + "\n"


ROWS_KERNEL = '''def _conv_kernel(x_ref, w_ref, {refs}o_ref, *, groups, first, length, epilogue, shapes):
    """The tile [rows, channels]: per product, a window of rows at its offset and its lanes (its taps' phases)
    times those taps' weights, summed in f32; {tail}.
    Rows of the window outside the input are the padding's zeros: masked only on the steps whose window
    reaches past an end."""
    rows = o_ref.shape[0]
    start = pl.program_id(2) * rows + first  # the phase row the window begins at

    def tile(window):
        acc = None
        for row, lane, lanes, weight in groups:
            term = _product(window[row:row + rows, lane:lane + lanes], w_ref[weight:weight + lanes, :])
            acc = term if acc is None else acc + term
        {store}

    edge = jnp.logical_or(start < 0, start + x_ref.shape[1] > length)

    @pl.when(edge)
    def _edge():
        window = x_ref[0]
        at = start + jax.lax.broadcasted_iota(jnp.int32, (window.shape[0], 1), 0)
        tile(jnp.where(jnp.logical_and(at >= 0, at < length), window, jnp.zeros((), window.dtype)))

    @pl.when(jnp.logical_not(edge))
    def _inside():
        tile(x_ref[0])

'''


def rows_conv_source(p: "ConvPlan") -> str:
    from maxkernel.rewrites.emit import dtype_expr

    names = [v.name for v in p.tail.inputs[1:]] if p.tileable else []
    h = np.dtype(p.tail.inputs[0].dtype)  # the convolution's output: the tail reads it rounded to its dtype
    acc = "acc[None]" if h == np.dtype("float32") else f"acc[None].astype({dtype_expr(h)})"
    loads = ", ".join([acc] + [f"{name}_ref[...].reshape(shapes[{i}])" for i, name in enumerate(names)])
    store = (f"o_ref[...] = epilogue({loads})[0].astype(o_ref.dtype)" if p.tileable
             else "o_ref[...] = acc.astype(o_ref.dtype)")
    tail = ("the reference's tail on the tile before the one write" if p.tileable
            else "XLA runs the tail on the convolution's output")
    return ROWS_KERNEL.format(refs="".join(f"{name}_ref, " for name in names), store=store, tail=tail)


def rows_kernel_source(p: "ConvPlan", names: list[str], statics: list[str], weight: str, bound: list[str]) -> str:
    """``kernel`` (the reference's signature): the phase split, the weights stacked by tap, one pallas_call
    over (output-channel blocks, samples, row blocks), and the tail in XLA when it does not run on tiles."""
    from maxkernel.rewrites.emit import dtype_expr

    assert p.rows is not None
    x = p.x.name
    others = [v.name for v in p.tail.inputs[1:]]
    fused = others if p.tileable else []
    out_dtype = dtype_expr(np.dtype(p.out.dtype if p.tileable else p.tail.inputs[0].dtype))
    spec = p.rows.rhs_spec
    low, high = ("pad_low", "pad_high") if p.rows.by_residue else ("PAD_LOW", "PAD_HIGH")
    extents = "(*h_shape[1:], " + "".join(f"static[{k!r}], " for k in statics).rstrip() + ")"
    in_specs = ["pl.BlockSpec((pl.Element(1), pl.Element(span, (ahead, beyond)), pl.Element(phased.shape[2])), "
                "lambda j, b, s: (b, s * block_rows + first + ahead, 0))",
                "pl.BlockSpec((w_rows.shape[0], block_n), lambda j, b, s: (0, j))"]
    in_specs += ["pl.BlockSpec((1, block_n), lambda j, b, s: (0, j))"] * len(fused)
    operands = ["phased", "w_rows"] + [f"{name}.reshape((1, -1))" for name in fused]
    shapes = "(" + "".join(f"{name}.shape[:-1] + (block_n,), " for name in fused) + ")"
    lines = [
        f"def kernel({', '.join(names)}, **static):",
        f"    w = {weight}",
        f"    n, length, c = {x}.shape",
        *([f"    w = jnp.transpose(w, {(spec[2], spec[1], spec[0])!r})  # [width, in-channels, out-channels]"]
          if (spec[2], spec[1], spec[0]) != (0, 1, 2) else []),
        "    o = w.shape[2]",
        *([f"    {low}, {high} = PADDING[length % STRIDE]  # the reference's padding at this length"] if p.rows.by_residue else []),
        f"    out = (length + {low} + {high} - DILATION * (WIDTH - 1) - 1) // STRIDE + 1",
        "    h_shape = (n, out, o)",
        "    if length % STRIDE:  # whole phase rows: zeros past the end, which the padding reads as zeros anyway",
        f"        {x} = jnp.pad({x}, ((0, 0), (0, STRIDE - length % STRIDE), (0, 0)))",
        "    # The stride's phases side by side on the lanes, a free reshape: tap k reads phase row t + e at lanes",
        f"    # r c ... (r + 1) c, e, r = divmod(k DILATION - {low}, STRIDE).",
        f"    phased = {x}.reshape((n, -1, STRIDE * c))",
        f"    first, last, groups = _tap_groups(WIDTH, STRIDE, DILATION, {low}, c)",
        "    w_rows = w.reshape((WIDTH * c, o))  # each tap's weights, one after another on the contraction",
        "    block_rows, block_n = min(BLOCK_ROWS, out), _fit(BLOCK_N, o)",
        "    steps = -(-out // block_rows)",
        "    span = -(-(block_rows + last - first) // 16) * 16  # a step's window: its rows and the halo",
        "    # The windows overlap by the halo and reach past both ends of the input: padded there (masked in the",
        "    # kernel, as what is read there is undefined).",
        "    ahead = max(0, -first)",
        "    beyond = max(0, (steps - 1) * block_rows + first + span - phased.shape[1])",
        f"    epilogue = _epilogue_for({extents})",
        *bound,
        f"    shapes = {shapes}",
        "    h = pl.pallas_call(",
        "        functools.partial(_conv_kernel, groups=groups, first=first, length=phased.shape[1], "
        f"epilogue={'epilogue' if p.tileable else 'None'}, shapes=shapes),",
        f"        out_shape=jax.ShapeDtypeStruct(h_shape, {out_dtype}),",
        "        grid=(o // block_n, n, steps),",
        "        in_specs=[" + ", ".join(in_specs) + "],",
        "        # The last step's rows past the output are not written (a partial edge block).",
        "        out_specs=pl.BlockSpec((None, block_rows, block_n), lambda j, b, s: (b, s, j)),",
        "        compiler_params=pltpu.CompilerParams(",
        '            dimension_semantics=("parallel", "parallel", "parallel"),',
        "            vmem_limit_bytes=VMEM_LIMIT_BYTES),",
        f"    )({', '.join(operands)})",
    ]
    lines += returned(p.tileable, others, "couples positions or reads more than a bias per channel")
    return "\n".join(lines) + "\n"


def returned(fused: bool, others: list[str], why: str) -> list[str]:
    """``kernel``'s last lines: the kernel's output when the tail ran in it, else XLA's tail on it (``why``)."""
    if fused:
        return ["    return h"]
    return [f"    # The tail {why}: XLA runs it on the output.",
            f"    return epilogue(h{''.join(', ' + name for name in others)})"]


def vmem_limit(p: "ConvPlan", params: dict[str, Any], passes: int) -> int:
    """The scoped VMEM the kernel asks for: what a step plans for, with half again for Mosaic's own."""
    planned = rows_vmem_bytes(p, int(params["block_rows"]), int(params["block_n"]), passes)
    return max(32 << 20, planned + (planned >> 1))

