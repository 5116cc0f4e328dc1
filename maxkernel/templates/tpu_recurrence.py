"""TPU recurrence: an elementwise scan over one axis, its inputs and outputs computed in the same kernel.

What an expert writes for ``h_t = f(h_(t-1), x_t)`` where ``f`` is elementwise (a gated linear recurrence,
a diagonal SSM, an exponential moving average) and what comes before and after is elementwise too:
- the sequence axis is a grid axis, innermost and ``arbitrary``; the carry lives in VMEM scratch from one
  block of steps to the next; every other axis is ``parallel``;
- each block of steps computes the scan's inputs for all its steps at once (the reference's own ops on
  whole tiles), then walks its steps in a ``fori_loop``, one dense [groups, 128] tile a step, and applies
  what follows the scan to the whole block of outputs before it is written once;
- the features after the sequence axis are viewed as groups of 128 lanes, so a step touches
  ``features / 1024`` vector registers instead of one sublane of ``features / 128`` of them.
XLA runs such a scan as a loop of small fused steps, each reading and writing HBM; here HBM sees each
input and output once.

A first-order linear recurrence ``h_t = a_t h_(t-1) + b_t`` (from zero) written without a ``scan`` (an
``associative_scan``, whose program is a tree of strided slices, products and sums) is read by what it
computes: the value the outputs are elementwise functions of is ``h``; among the values computed
elementwise from the inputs, the pair ``(a, b)`` and the axis for which the recurrence run in float64
reproduces ``h`` on the task's inputs at ``cpu`` size are the scan's sequences. Its step is then the
recurrence itself, whatever the reference wrote for it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from maxkernel.analysis.graph import ELEMENTWISE
from maxkernel.analysis.program import Const, Program, ProgramBuilder, Var, arg_names, trace_program
from maxkernel.rewrites.emit import EmitError, dtype_expr, emit_function, emittable
from maxkernel.templates.base import FIT_SOURCE, TemplateSpace, tpu_target
from maxkernel.templates.tpu_gemm import HEADER

if TYPE_CHECKING:
    from jaxbench.task import Task
    from maxkernel.analysis import TaskAnalysis

LANES = 128
BLOCKS_T = (64, 128, 256, 512)  # sequence steps per grid step: the loop's trip count
BLOCKS_G = (8, 16, 32, 64)  # lane groups per grid step (a multiple of 8 sublanes), or all of them
UNROLL = 8  # steps a loop trip walks (unrolled): one [8, groups, 128] load per sequence and store per output
VMEM_SHARE = 0.4  # of the chip's VMEM: double-buffered blocks and the f32 staging of the scan's values


@dataclass
class RecurrencePlan:
    """A program read as prologue -> elementwise scan over ``axis`` -> epilogue, all on ``domain``."""

    domain: tuple[int, ...]
    axis: int
    inputs: list[Var]  # the program inputs the kernel reads, each of the domain's shape
    prologue: Program  # inputs -> the scan's sequences (in the domain's layout)
    step: Program  # (carries..., one step of each sequence...) -> (carries..., one step of each output...)
    epilogue: Program  # (the scan's outputs in the domain's layout..., inputs...) -> the program's outputs
    fills: list[float]  # each carry's initial value
    carry_dtypes: list[np.dtype]
    texts: tuple[str, str, str] = ("", "", "")

    @property
    def features(self) -> int:
        return math.prod(self.domain[self.axis + 1:])

    @property
    def length(self) -> int:
        return self.domain[self.axis]

    @property
    def outer(self) -> int:
        return math.prod(self.domain[:self.axis])


def _fill(program: Program, var: object) -> float | None:
    """The value a carry starts from, when it is a constant broadcast."""
    node = program.producers().get(var) if isinstance(var, Var) else None
    if node is None or node.prim != "broadcast_in_dim" or not isinstance(node.ins[0], Const) or node.ins[0].shape:
        return None
    return float(np.asarray(node.ins[0].value))


def _moved(perm: tuple[int, ...]) -> int | None:
    """The axis a transpose moves to the front keeping the others in order, else None."""
    axis = perm[0]
    rest = [a for a in range(len(perm)) if a != axis]
    return axis if list(perm[1:]) == rest else None


def _cut(program: Program, inputs: list[Var], outputs: list[Var], tree: bool) -> Program:
    """The part of ``program`` computing ``outputs`` from ``inputs`` (fresh names kept)."""
    sub = program.copy()
    cut = set(inputs)
    sub.nodes = [nd for nd in sub.nodes if not cut & set(nd.outs)]
    sub.inputs, sub.outputs = list(inputs), list(outputs)
    sub.out_tree = jax.tree_util.tree_structure(tuple(range(len(outputs)))) if tree else program.out_tree
    return sub.dce()


def _elementwise_on(sub: Program, shape: tuple[int, ...]) -> str | None:
    for node in sub.nodes:
        if node.prim not in ELEMENTWISE:
            return f"a {node.prim} before or after the scan (only elementwise work fuses around it)"
        if any(isinstance(op, Var) and op.shape != shape for op in node.ins + node.outs):
            return "a value around the scan that is not of the sequences' shape"
    missing = {op for nd in sub.nodes for op in nd.ins if isinstance(op, Var)} - set(sub.inputs) - {
        o for nd in sub.nodes for o in nd.outs}
    return "a value around the scan that reads neither the inputs nor the scan" if missing else None


def match(program: Program) -> RecurrencePlan | str:
    """The recurrence of ``program``, or why it has none."""
    scans = [nd for nd in program.nodes if nd.prim == "scan"]
    if len(scans) != 1:
        return f"{len(scans)} scans (the template runs one elementwise scan)"
    scan = scans[0]
    p = scan.params
    n_carry, length = int(p["num_carry"]), int(p["length"])
    if int(p["num_consts"]) or p["jaxpr"].consts or bool(p["reverse"]):
        return "a scan with constants or run in reverse"
    carries, xs = scan.ins[:n_carry], scan.ins[n_carry:]
    finals, ys = scan.outs[:n_carry], scan.outs[n_carry:]
    users = program.users()
    if any(users.get(v) or v in program.outputs for v in finals) or not xs or not ys:
        return "a scan whose final carry is used, or with no sequence in or out"
    fills = [_fill(program, c) for c in carries]
    if any(f is None for f in fills):
        return "a carry that does not start from a constant"
    producers = program.producers()
    sources: list[Var] = []
    axis: int | None = None
    for x in xs:
        if not isinstance(x, Var):
            return "a constant sequence"
        node = producers.get(x)
        transposed = node is not None and node.prim == "transpose" and isinstance(node.ins[0], Var)
        moved = _moved(tuple(node.params["permutation"])) if transposed else 0  # else scanned along its axis 0
        if moved is None or (axis is not None and moved != axis):
            return "a sequence that is not one axis of the inputs moved to the front"
        axis = moved
        sources.append(node.ins[0] if transposed and moved else x)
    assert axis is not None
    domain = tuple(sources[0].shape)
    if any(tuple(s.shape) != domain for s in sources) or domain[axis] != length:
        return "sequences of different shapes"
    inverse = tuple(int(i) for i in np.argsort((axis, *[a for a in range(len(domain)) if a != axis])))
    outs: list[Var] = []
    for y in ys:
        readers = users.get(y, [])
        if axis == 0:  # the scan's own layout
            outs.append(y)
            continue
        if len(readers) != 1 or readers[0].prim != "transpose" or tuple(readers[0].params["permutation"]) != inverse:
            return "a scan output not moved back to the inputs' layout"
        outs.append(readers[0].out)
    if math.prod(domain[axis + 1:]) % LANES:
        return f"features after the sequence axis ({math.prod(domain[axis + 1:])}) not a multiple of {LANES} lanes"
    inputs = [v for v in program.inputs if v.shape == domain]
    prologue = _cut(program, inputs, sources, tree=True)
    epilogue = _cut(program, outs + inputs, [o for o in program.outputs if isinstance(o, Var)], tree=False)
    if len(epilogue.outputs) != len(program.outputs):
        return "an output that is not an array"
    for sub in (prologue, epilogue):
        reason = _elementwise_on(sub, domain)
        if reason is not None:
            return reason
    if any(isinstance(o, Var) and o.shape != domain for o in epilogue.outputs):
        return "an output that is not of the sequences' shape"
    names = [f"carry{i}" if n_carry > 1 else "carry" for i in range(n_carry)] + [f"step{i}" for i in range(len(xs))]
    step = ProgramBuilder().build(p["jaxpr"], names)
    step.out_tree = jax.tree_util.tree_structure(tuple(range(len(step.outputs))))
    if any(nd.prim not in ELEMENTWISE for nd in step.nodes):
        return "a scan step that is not elementwise"
    return RecurrencePlan(domain, axis, inputs, prologue.dce(), step, epilogue.dce(), [float(f) for f in fills if f is not None],
                          [np.dtype(c.dtype) for c in carries])


MAX_SEQUENCE_CANDIDATES = 12  # values computed elementwise from the inputs tried as the recurrence's a and b
MAX_PROBE_ELEMENTS = 1 << 24  # the largest value the probe computes (64 MiB in f32)
# What a scan written without ``scan`` is made of (an associative scan's strided slices and pads, a cumulative
# sum or product); a program with none of them, or with work no recurrence does, is not probed.
SCAN_LIKE = frozenset({"cumsum", "cumprod", "cumlogsumexp", "pad"})
NOT_A_RECURRENCE = frozenset({"dot_general", "conv_general_dilated", "gather", "scatter", "scatter-add", "sort",
                              "reduce_sum", "reduce_max", "reduce_min", "argmax", "argmin", "while", "cond"})


def _scan_like(program: Program) -> bool:
    prims = {nd.prim for nd in program.nodes}
    strided = any(nd.prim == "slice" and nd.params.get("strides") not in (None, ()) and
                  any(s != 1 for s in nd.params["strides"]) for nd in program.nodes)
    return (strided or bool(prims & SCAN_LIKE)) and not prims & NOT_A_RECURRENCE


def _results_of(program: Program) -> list[Var]:
    """The values the first output is an elementwise function of, nearest first: walking back from it
    through elementwise nodes of its shape (which one is the recurrence's ``h`` the probe tells)."""
    producers = program.producers()
    out = program.outputs[0] if program.outputs else None
    if not isinstance(out, Var):
        return []
    found, frontier = [out], [out]
    while frontier:
        v = frontier.pop(0)
        node = producers.get(v)
        if node is None or node.prim not in ELEMENTWISE or node.out.shape != out.shape:
            continue
        for op in node.ins:
            if isinstance(op, Var) and op.shape == out.shape and op not in found:
                found.append(op)
                frontier.append(op)
    return found


def _from_inputs(program: Program, shape: tuple[int, ...]) -> list[Var]:
    """The values of ``shape`` computed from the inputs by elementwise nodes alone (the inputs of that shape
    first), in program order."""
    pure: set[Var] = set(program.inputs)
    found = [v for v in program.inputs if v.shape == shape]
    for node in program.nodes:
        if node.prim in ELEMENTWISE and all(op in pure for op in node.ins if isinstance(op, Var)):
            pure.update(node.outs)
            found.extend(o for o in node.outs if o.shape == shape)
    return found


def _recurrence64(a: np.ndarray, b: np.ndarray, axis: int) -> np.ndarray:
    a, b = np.moveaxis(a.astype(np.float64), axis, 0), np.moveaxis(b.astype(np.float64), axis, 0)
    h = np.empty_like(b)
    carry = np.zeros(b.shape[1:])
    for t in range(b.shape[0]):
        carry = a[t] * carry + b[t]
        h[t] = carry
    return np.moveaxis(h, 0, axis)


def linear_reading(task: "Task") -> tuple[int, int, int, int] | str:
    """Which values are ``a`` and ``b`` (positions in :func:`_from_inputs` order) and ``h`` (in
    :func:`_results_of` order), and along which axis the reference's scan-free program runs
    ``h_t = a_t h_(t-1) + b_t``, probed on its inputs at ``cpu`` size."""
    import jax.numpy as jnp

    program = trace_program(task, "cpu").dce()
    if not _scan_like(program):
        return "no strided slices, pads or cumulative ops that could spell a scan"
    if any(o.size > MAX_PROBE_ELEMENTS for nd in program.nodes for o in nd.outs):
        return "too large at cpu size to probe for a recurrence"
    results = _results_of(program)
    if not results or len(results[0].shape) < 2:
        return "no value the outputs are elementwise functions of"
    shape = results[0].shape
    options = _from_inputs(program, shape)
    results = [r for r in results if r not in options and np.issubdtype(np.dtype(r.dtype), np.floating)]
    if not options or not results or len(options) > MAX_SEQUENCE_CANDIDATES:
        return "no values computed elementwise from the inputs to read as a recurrence's sequences"
    args, _ = task.get_inputs(jax.random.key(0), "cpu")
    env: dict[Any, Any] = dict(zip(program.inputs, [jnp.asarray(a) for a in jax.tree_util.tree_leaves(args)]))
    for node in program.nodes:
        out = node.primitive.bind(*[env[op] if isinstance(op, Var) else op.value for op in node.ins], **node.params)
        env.update(zip(node.outs, out if node.primitive.multiple_results else [out]))
    values = [np.asarray(env[v], np.float64) for v in options]
    for k, h in enumerate(_results_of(program)):
        if h not in results:
            continue
        got = np.asarray(env[h], np.float64)
        scale = float(np.max(np.abs(got))) or 1.0
        for axis in range(len(shape)):
            if shape[axis] < 2:
                continue
            for i, a in enumerate(values):
                for j, b in enumerate(values):
                    if i != j and np.allclose(_recurrence64(a, b, axis), got, rtol=1e-3, atol=1e-4 * scale):
                        return i, j, k, axis
    return "no pair of values computed from the inputs runs a linear recurrence to the outputs' value"


def match_linear(program: Program, reading: tuple[int, int, int, int]) -> RecurrencePlan | str:
    """The plan of a scan-free linear recurrence whose sequences ``reading`` names (see :func:`linear_reading`)."""
    i, j, k, axis = reading
    results = _results_of(program)
    options = _from_inputs(program, results[0].shape) if results else []
    if max(i, j) >= len(options) or k >= len(results):
        return "the recurrence's sequences are computed differently at another size"
    a, b, h = options[i], options[j], results[k]
    domain = tuple(h.shape)
    if math.prod(domain[axis + 1:]) % LANES:
        return f"features after the sequence axis ({math.prod(domain[axis + 1:])}) not a multiple of {LANES} lanes"
    inputs = [v for v in program.inputs if v.shape == domain]
    prologue = _cut(program, inputs, [a, b], tree=True)
    epilogue = _cut(program, [h] + inputs, [o for o in program.outputs if isinstance(o, Var)], tree=False)
    for sub in (prologue, epilogue):
        reason = _elementwise_on(sub, domain)
        if reason is not None:
            return reason
    carry = np.dtype(h.dtype)
    one = tuple(d for k, d in enumerate(domain) if k != axis)

    def step(h_prev: Any, a_t: Any, b_t: Any) -> tuple[Any, Any]:
        h_t = a_t.astype(carry) * h_prev + b_t.astype(carry)
        return h_t, h_t

    specs = [jax.ShapeDtypeStruct(one, carry), jax.ShapeDtypeStruct(one, a.dtype), jax.ShapeDtypeStruct(one, b.dtype)]
    stepped = ProgramBuilder().build(jax.make_jaxpr(step)(*specs), ["carry", "step0", "step1"])
    stepped.out_tree = jax.tree_util.tree_structure((0, 0))
    return RecurrencePlan(domain, axis, inputs, prologue.dce(), stepped, epilogue.dce(), [0.0], [carry])


def plan(task: "Task", sizes: tuple[str, ...]) -> RecurrencePlan | str:
    """The plan at every size, each part written the same at all of them (one body serves every size)."""
    found: list[RecurrencePlan] = []
    reading: tuple[int, int, int, int] | str | None = None
    for size in sizes:
        program = trace_program(task, size).dce()
        p = match(program)
        if isinstance(p, str) and not any(nd.prim == "scan" for nd in program.nodes):
            reading = linear_reading(task) if reading is None else reading
            p = f"{p}, nor a linear recurrence without one ({reading})" if isinstance(reading, str) \
                else match_linear(program, reading)
        if isinstance(p, str):
            return p
        for sub in (p.prologue, p.step, p.epilogue):
            reason = emittable(sub)
            if reason is not None:
                return reason
        p.texts = (emit_function(p.prologue, "_prologue", "The reference before its scan, on a block of steps."),
                   emit_function(p.step, "_step", "One step of the reference's scan."),
                   emit_function(p.epilogue, "_epilogue", "The reference after its scan, on a block of steps."))
        found.append(p)
    if len({(p.texts, p.axis, len(p.domain), tuple(p.fills)) for p in found}) != 1:
        return "the scan or the work around it is written differently at different sizes"
    return found[-1]


def _bytes_per_element(p: RecurrencePlan) -> tuple[int, int]:
    """Bytes per element of one step: of the double-buffered blocks, and of the f32 staging of every
    sequence and scan output."""
    ins = sum(np.dtype(v.dtype).itemsize for v in p.inputs)
    outs = sum(np.dtype(o.dtype).itemsize for o in p.epilogue.outputs if isinstance(o, Var))
    return 2 * (ins + outs), 4 * (len(p.prologue.outputs) + len(p.step.outputs) - len(p.fills))


def _sublanes(block_g: int) -> int:
    """The sublanes ``block_g`` groups take in a VMEM tile: rounded up to 16 (a packed bf16 tile's; an f32
    tile's 8 divide it)."""
    return -(-block_g // 16) * 16


def vmem_bytes(p: RecurrencePlan, block_t: int, block_g: int) -> int:
    """What one grid step holds: its blocks, the staging and the carries, in whole tiles."""
    blocks, staged = _bytes_per_element(p)
    return block_t * _sublanes(block_g) * LANES * (blocks + staged) + 4 * _sublanes(block_g) * LANES * len(p.fills)


class TpuRecurrenceTemplate:
    name = "tpu_recurrence"
    description = ("an elementwise scan over one axis in one kernel: the sequence axis innermost with the carry "
                   "in VMEM, the work before and after the scan on whole blocks of steps, one dense tile a step")

    def applies(self, task: "Task", analysis: "TaskAnalysis") -> str | None:
        found = plan(task, ("cpu", "full"))
        return found if isinstance(found, str) else None

    def space(self, task: "Task", analysis: "TaskAnalysis", target: str) -> TemplateSpace:
        if not tpu_target(target):
            return TemplateSpace(defaults={}, space={"block_t": []})
        from maxkernel.targets.specs import load_tpu_specs

        p = plan(task, ("full",))
        assert not isinstance(p, str)
        cap = int(load_tpu_specs()[target.removeprefix("tpu-")].vmem_bytes * VMEM_SHARE)
        groups = p.features // LANES
        gs = sorted({g for g in BLOCKS_G if groups % g == 0 and g < groups} | {groups})
        ts = [t for t in BLOCKS_T if p.length % t == 0] or [p.length]
        fits = [(t, g) for t in ts for g in gs if vmem_bytes(p, t, g) <= cap]
        if not fits:
            return TemplateSpace(defaults={"block_t": 0}, space={"block_t": []})
        t, g = max(fits, key=lambda tg: (tg[1], tg[0]))  # every lane group at once, then the longest loop
        return TemplateSpace(defaults={"block_t": t, "block_g": g},
                             space={"block_t": sorted({tt for tt, gg in fits if gg == g}),
                                    "block_g": sorted({gg for tt, gg in fits if tt == t})})

    def render(self, task: "Task", params: dict[str, Any], sizes: tuple[str, ...]) -> str:
        p = plan(task, sizes)
        if isinstance(p, str):
            raise EmitError(p)
        doc = (f'"""{task.id}: {self.description}.\n\nGenerated by MaxKernel\'s rules brain: {params["block_t"]} '
               f'steps by {params["block_g"]} groups of {LANES} features a grid step.\n"""\n')
        constants = (f"BLOCK_T = {int(params['block_t'])}  # sequence steps per grid step (the loop's trip count)\n"
                     f"BLOCK_G = {int(params['block_g'])}  # groups of {LANES} features per grid step\n"
                     f"LANES = {LANES}\n"
                     f"UNROLL = {UNROLL}  # steps a loop trip walks, their slabs loaded and stored at once\n")
        return "\n".join([doc, HEADER, constants, FIT_SOURCE, "", *p.texts[:1], "", *p.texts[1:2], "", *p.texts[2:],
                          "", _body_source(p), _kernel_source(p, arg_names(task))])


def _body_source(p: RecurrencePlan) -> str:
    ins = [f"{v.name}_ref" for v in p.inputs]
    n_carry, n_seq = len(p.fills), len(p.prologue.outputs)
    n_out = len(p.step.outputs) - n_carry
    outs = [f"o{i}_ref" for i in range(len(p.epilogue.outputs))]
    carries = [f"carry{i}_ref" for i in range(n_carry)]
    seqs = [f"seq{i}_ref" for i in range(n_seq)]
    scanned = [f"scanned{i}_ref" for i in range(n_out)]
    block_ins = ", ".join(f"{r}[0]" for r in ins)
    lines = [f"def _recurrence_kernel({', '.join(ins + outs + carries + seqs + scanned)}):",
             '    """One block of steps of every lane group: the sequences computed for the whole block, the scan',
             '    walked step by step from the carry the previous block left, the outputs written once."""',
             "    @pl.when(pl.program_id(2) == 0)",
             "    def _start():"]
    lines += [f"        {c}[...] = jnp.full({c}.shape, {fill!r}, {c}.dtype)" for c, fill in zip(carries, p.fills)]
    seq_targets = ", ".join(f"{s}[...]" for s in seqs) + ("," if n_seq == 1 else "")
    lines += ["", f"    {seq_targets} = _prologue({block_ins})",
              f"    chunk = math.gcd(UNROLL, {seqs[0]}.shape[0])", "",
              "    def one_chunk(c, carry):",
              '        """``chunk`` steps: their slabs loaded and stored at once, the steps unrolled between."""',
              "        start = pl.multiple_of(c * chunk, chunk)"]
    lines += [f"        {s[:-4]} = {s}[pl.ds(start, chunk)]" for s in seqs]
    lines += [f"        {s[:-4]} = []" for s in scanned]
    lines += ["        for i in range(chunk):",
              f"            out = _step(*carry, {', '.join(f'{s[:-4]}[i:i + 1]' for s in seqs)})",
              f"            carry = out[:{n_carry}]"]
    lines += [f"            {s[:-4]}.append(out[{n_carry + i}])" for i, s in enumerate(scanned)]
    lines += [f"        {s}[pl.ds(start, chunk)] = jnp.concatenate({s[:-4]}, axis=0)" for s in scanned]
    lines += ["        return carry", "",
              f"    carry = jax.lax.fori_loop(0, {seqs[0]}.shape[0] // chunk, one_chunk, ({', '.join(f'{c}[...]' for c in carries)},))"]
    lines += [f"    {c}[...] = carry[{i}]" for i, c in enumerate(carries)]
    epi_args = ", ".join([f"{s}[...]" for s in scanned] + [f"{r}[0]" for r in ins])
    if len(outs) == 1:
        lines += [f"    {outs[0]}[0] = _epilogue({epi_args}).astype({outs[0]}.dtype)"]
    else:
        lines += [f"    results = _epilogue({epi_args})"]
        lines += [f"    {o}[0] = results[{i}].astype({o}.dtype)" for i, o in enumerate(outs)]
    return "\n".join(lines) + "\n\n"


def _kernel_source(p: RecurrencePlan, names: list[str]) -> str:
    first = p.inputs[0].name
    n_carry, n_seq = len(p.fills), len(p.prologue.outputs)
    n_out = len(p.step.outputs) - n_carry
    outs = [o for o in p.epilogue.outputs if isinstance(o, Var)]
    spec = "pl.BlockSpec((1, block_t, block_g, LANES), lambda b, g, t: (b, t, g, 0))"
    out_shapes = ", ".join(f"jax.ShapeDtypeStruct(view, {dtype_expr(np.dtype(o.dtype))})" for o in outs)
    scratch = ([f"pltpu.VMEM((1, block_g, LANES), {dtype_expr(d)})" for d in p.carry_dtypes]
               + ["pltpu.VMEM((block_t, block_g, LANES), jnp.float32)"] * (n_seq + n_out))
    operands = ", ".join(f"{v.name}.reshape(view)" for v in p.inputs)
    single = len(outs) == 1
    lines = [
        f"def kernel({', '.join(names)}, **static):",
        f"    shape = {first}.shape",
        f"    axis = {p.axis}  # the scan's axis",
        "    outer, steps, features = math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])",
        "    view = (outer, steps, features // LANES, LANES)  # features as dense groups of 128 lanes",
        "    block_t, block_g = _fit(BLOCK_T, steps), _fit(BLOCK_G, features // LANES)",
        "    # What one step holds (blocks double-buffered, the f32 staging, the carries; groups in whole tiles of",
        "    # 16 sublanes): the limit is raised to it, with headroom for Mosaic's own temporaries.",
        "    sublanes = -(-block_g // 16) * 16",
        f"    planned = block_t * sublanes * LANES * {sum(_bytes_per_element(p))} + 4 * sublanes * LANES * {n_carry}",
        "    results = pl.pallas_call(",
        "        _recurrence_kernel,",
        f"        out_shape={'' if single else '('}{out_shapes}{'' if single else ',)'},",
        "        grid=(outer, features // LANES // block_g, steps // block_t),",
        f"        in_specs=[{', '.join([spec] * len(p.inputs))}],",
        f"        out_specs={spec if single else '(' + ', '.join([spec] * len(outs)) + ',)'},",
        f"        scratch_shapes=[{', '.join(scratch)}],",
        '        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary"),',
        f"                                             vmem_limit_bytes=max(32 << 20, planned + (planned >> 2))),",
        f"    )({operands})",
    ]
    if single:
        lines.append("    return results.reshape(shape)")
    else:
        lines.append("    return tuple(r.reshape(shape) for r in results)")
    return "\n".join(lines) + "\n"


TPU_RECURRENCE = TpuRecurrenceTemplate()

__all__ = ["TPU_RECURRENCE", "RecurrencePlan", "match", "plan", "vmem_bytes"]
