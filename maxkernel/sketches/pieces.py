"""Pieces of emitted Pallas source a reader can follow: the imports, the body dispatch, the kernel
function, its BlockSpecs and grid, and the wrapper that calls it. Sketches assemble them; each is
written once here."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from maxkernel.analysis.statics import bind, header_statics, passed_on

if TYPE_CHECKING:
    from maxkernel.sketches.fused import FusedPlan

HEADER = ("import functools\nimport math\n\nimport jax\nimport jax.numpy as jnp\nfrom jax.experimental import pallas as pl\n"
          "from jax.experimental.pallas import tpu as pltpu\n")


def sublane(dtype: Any) -> int:
    """Rows of one TPU tile for this element size: 8 for 32-bit, 16 for 16-bit, 32 for 8-bit values."""
    return {1: 32, 2: 16}.get(np.dtype(dtype).itemsize, 8)


def bodies_source(variants: dict[tuple, str], name: str) -> str:
    """The emitted body (or one per set of shapes its constants follow) and ``{name}_for(key)`` that
    picks the one written for the arrays at hand."""
    if () in variants:
        return variants[()] + f"\n\n\ndef {name}_for(key):\n    return {name}\n\n"
    keys = sorted(variants)
    bodies = [variants[k].replace(f"def {name}(", f"def {name}_{i}(", 1) for i, k in enumerate(keys)]
    checks = "".join(f"    if key == {k}:\n        return {name}_{i}\n" for i, k in enumerate(keys))
    return "\n\n".join(bodies) + f'''


def {name}_for(key):
    """The body written for these shapes (constants of the computation follow them: a mean divides by the
    row width)."""
{checks}    raise ValueError(f"written for shapes {keys} only, not {{key}}")

'''


def _layout(rank: int, lifted: bool, gridded: bool = False) -> tuple[list[int | None], str]:
    """How an array travels to the kernel: for each layout axis, the original axis it is (None: a unit
    axis added), and the reshape that makes it (scalars and vectors become 2-D: a vector the grid splits
    as a column, so its blocks are rows; a lifted array gets a unit axis before its last one)."""
    if rank == 0:
        return [None, None], ".reshape(1, 1)"
    if rank == 1:
        return ([0, None], ".reshape(-1, 1)") if gridded else ([None, 0], ".reshape(1, -1)")
    if lifted:
        return list(range(rank - 1)) + [None, rank - 1], ""
    return list(range(rank)), ""


def _array_spec(name: str, rank: int, lifted: bool, gridded: dict[int, str], index_args: str) -> tuple[str, str]:
    """(the operand as passed, its BlockSpec)."""
    layout, reshape = _layout(rank, lifted, bool(gridded))
    if lifted:
        reshape = f".reshape({name}.shape[:-1] + (1, {name}.shape[-1]))"
    block, index = [], []
    for axis in layout:
        if axis is None:
            block.append("1")
            index.append("0")
        elif axis in gridded:
            block.append(f"block_{gridded[axis]}")
            index.append(f"{gridded[axis]}_i")
        else:
            block.append(f"{name}.shape[{axis}]")
            index.append("0")
    spec = f"pl.BlockSpec(({', '.join(block)},), lambda {index_args}: ({', '.join(index)},))"
    return f"{name}{reshape}", spec


def _takes(texts: Any, name: str) -> list[str]:
    """The statics the emitted ``name`` takes (the same in every variant of it)."""
    return sorted({static for text in texts for static in header_statics(text, name)})


def _also(names: list[str]) -> str:
    """``, a, b``: keyword-only parameters after others already behind a ``*``."""
    return "".join(f", {name}" for name in names)


def _call(positional: str, keywords: str) -> str:
    """The arguments of a call: ``positional`` then ``keywords`` (``", a=a"`` as the statics' helpers write
    them), without a leading comma when there are no positional ones."""
    return ", ".join(part for part in (positional, keywords.removeprefix(", ")) if part)


def _given(names: list[str]) -> str:
    """``, a=static['a']``: the statics passed on from ``kernel``'s ``**static`` (empty without any)."""
    return f", {bind(names)}" if names else ""


def fused_kernel_source(p: "FusedPlan", names: list[str], lifted: list[bool], out_lifted: list[bool],
                        out_tree: Any, vmem_limit: bool = False, hoist: Any = None) -> str:
    """The kernel, and ``kernel`` (the reference's signature) that grids it over the plan's axes; with a
    split matmul, its contracted axis runs innermost into a float32 accumulator."""
    grid = p.grid
    index_args = ", ".join(f"{g.name}_i" for g in grid)
    outs = [f"out{j}" for j in range(len(p.outputs))]
    refs = [f"{n}_ref" for n in names] + [f"{o}_ref" for o in outs] + (["acc_ref"] if p.split else []) + \
        ([f"cache{c}_ref" for c in range(len(hoist.cached))] if hoist is not None else [])
    loads, operands, in_specs, shapes = {}, [], [], []
    for i, (v, n) in enumerate(zip(p.inputs, names)):
        gridded = {g.in_axes[i]: g.name for g in grid if g.in_axes[i] is not None}
        passed, spec = _array_spec(n, len(v.shape), lifted[i], gridded, index_args)
        operands.append(passed)
        in_specs.append(spec)
        shape = ", ".join(f"block_{gridded[a]}" if a in gridded else f"{n}.shape[{a}]" for a in range(len(v.shape)))
        shapes.append(f"({shape}{',' if len(v.shape) == 1 else ''})")
        loads[i] = f"{n} = {n}_ref[...].reshape(shapes[{i}])"
    out_specs, out_shapes, stores, unpack = [], [], [], []
    for j, (o, name) in enumerate(zip(p.outputs, outs)):
        gridded = {g.out_axes[j]: g.name for g in grid if g.out_axes[j] is not None}
        layout, _ = _layout(len(o.shape), out_lifted[j], True)
        lay = ", ".join("1" if a is None else f"outs[{j}].shape[{a}]" for a in layout)
        out_shapes.append(f"jax.ShapeDtypeStruct(({lay},), outs[{j}].dtype)")
        block, index = [], []
        for a in layout:
            block.append("1" if a is None else f"block_{gridded[a]}" if a in gridded else f"outs[{j}].shape[{a}]")
            index.append(f"{gridded[a]}_i" if a is not None and a in gridded else "0")
        out_specs.append(f"pl.BlockSpec(({', '.join(block)},), lambda {index_args}: ({', '.join(index)},))")
        stores.append(f"{name}_ref[...] = values[{j}].reshape({name}_ref.shape).astype({name}_ref.dtype)")
        unpack.append(f"results[{j}].reshape(outs[{j}].shape)")
    extents = []
    for g in grid:
        if g.reduction:
            i = next(k for k, a in enumerate(g.in_axes) if a is not None)
            where = f"{names[i]}.shape[{g.in_axes[i]}]"
        else:
            where = f"outs[0].shape[{g.out_axes[0]}]"
        fit = (f"_fit(BLOCK_{g.name.upper()}, {g.name})  # the contracted axis: whole blocks only" if g.reduction
               else f"min(BLOCK_{g.name.upper()}, {g.name})  # a partial last block is never written past the end")
        extents.append(f"    {g.name} = {where}\n    block_{g.name} = {fit}")
    key = ", ".join("(" + "".join(f"{n}.shape[{a}], " for a in range(len(v.shape))
                                  if a not in {g.in_axes[i] for g in grid}) + ")"
                    for i, (v, n) in enumerate(zip(p.inputs, names)))
    single = len(p.outputs) == 1 and (out_tree is None or out_tree.num_leaves == 1 and out_tree.num_nodes == 1)
    if p.tail is not None:  # some outputs left to XLA, after the kernel
        t = p.tail
        reads = ", ".join([unpack[j] for j in t.frontier] + [names[i] for i in t.inputs])
        finals = [unpack[j] if where == "kernel" else f"after[{j}]" for where, j in t.places]
        unpack = finals
        single = False
    args = ", ".join(names)
    steps = ", ".join(f"{g.name} // block_{g.name}" if g.reduction else f"pl.cdiv({g.name}, block_{g.name})" for g in grid)
    returned = unpack[0] if single else "(" + ", ".join(unpack) + ("," if len(unpack) == 1 else "") + ")"
    semantics = ", ".join('"arbitrary"' if g.reduction or (hoist is not None and g is grid[-1]) else '"parallel"'
                          for g in grid)
    nl = "\n"
    limit = ", vmem_limit_bytes=VMEM_LIMIT_BYTES" if vmem_limit else ""
    if hoist is not None:
        k = len(grid) - 1
        first = ", ".join(names[i] for i in hoist.prologue_inputs)
        rest = ", ".join(names[i] for i in hoist.main_inputs)
        count = len(hoist.cached)
        cached_loads = ", ".join(f"cache{c}_ref[...].reshape(cache[{c}].shape)" for c in range(count))
        s_pro, s_main = _takes([hoist.text], "_prologue"), _takes([hoist.text], "_main")
        taken = sorted(set(s_pro) | set(s_main))
        body = f'''def _fused_kernel({", ".join(refs)}, *, shapes, cache{_also(taken)}):
    """At the first step of the innermost axis, what it does not change into VMEM scratch; at every step,
    the rest of the reference from it, each output block written once."""
    @pl.when(pl.program_id({k}) == 0)
    def _hoisted():
{nl.join("        " + loads[i] for i in hoist.prologue_inputs)}
        for ref, value in zip(({", ".join(f"cache{c}_ref" for c in range(count))},), _prologue({_call(first, passed_on(s_pro))})):
            ref[...] = value.reshape(ref.shape)

{nl.join("    " + loads[i] for i in hoist.main_inputs)}
    values = _main({cached_loads}{", " + rest if rest else ""}{passed_on(s_main)})
    values = values if isinstance(values, tuple) else (values,)
{nl.join("    " + s for s in stores)}
'''
        prologue = f"functools.partial(_prologue, {bind(s_pro)})" if s_pro else "_prologue"
        find = (f"    cache = jax.eval_shape({prologue}, " + ", ".join(
            f"jax.ShapeDtypeStruct(shapes[{i}], {names[i]}.dtype)" for i in hoist.prologue_inputs) + ")")
        call_body = "cache=cache" + _given(taken)
        scratch = ("\n        scratch_shapes=[pltpu.VMEM(c.shape if len(c.shape) >= 2 else (1,) + c.shape, c.dtype) "
                   "for c in cache],")
        eval_shape = (f"jax.eval_shape(lambda {args}: _main(*_prologue({_call(first, _given(s_pro))}){', ' + rest if rest else ''}"
                      f"{_given(s_main)}), {args})")
    elif p.split is None:
        body = f'''def _fused_kernel({", ".join(refs)}, *, body, shapes):
    """The reference on one block of each input, held in VMEM; each output block written once."""
{nl.join("    " + loads[i] for i in range(len(names)))}
    values = body({args})
    values = values if isinstance(values, tuple) else (values,)
{nl.join("    " + s for s in stores)}
'''
        s_ref = _takes(p.variants.values(), "_reference")
        find = "    body = _reference_for(key)" + (f"\n    body = functools.partial(body, {bind(s_ref)})  # the statics it reads"
                                                  if s_ref else "")
        call_body, scratch = "body=body", ""
        eval_shape = f"jax.eval_shape(body, {args})"
    else:
        k = len(grid) - 1
        first = ", ".join(names[i] for i in p.split.partial_inputs)
        rest = ", ".join(names[i] for i in p.split.finish_inputs)
        text = next(iter(p.variants.values()))
        s_part, s_fin = _takes([text], "_partial"), _takes([text], "_finish")
        taken = sorted(set(s_part) | set(s_fin))
        finish_args = ", ".join(["acc_ref[...].reshape(acc_shape)"] + ([rest] if rest else [])) + passed_on(s_fin)
        body = f'''def _fused_kernel({", ".join(refs)}, *, shapes{_also(taken)}):
    """One block of the matmul's contracted axis into the float32 accumulator; at the last block, the rest
    of the reference on the accumulated product, each output block written once."""
    @pl.when(pl.program_id({k}) == 0)
    def _start():
        acc_ref[...] = jnp.zeros_like(acc_ref)

{nl.join("    " + loads[i] for i in p.split.partial_inputs)}
    acc_ref[...] += _partial({_call(first, passed_on(s_part))}).reshape(acc_ref.shape)

    @pl.when(pl.program_id({k}) == pl.num_programs({k}) - 1)
    def _end():
{nl.join("        " + loads[i] for i in p.split.finish_inputs)}
        values = _finish({finish_args})
        values = values if isinstance(values, tuple) else (values,)
{nl.join("        " + s for s in stores)}
'''.replace("acc_shape", "shapes[-1]").replace(", )", ")")
        find = ""
        call_body = bind(taken)
        acc_dims = []
        for a, d in enumerate(p.split.acc.shape):
            g = next((g for g in p.parallel if g.out_axes[0] is not None and _acc_axis(p, g) == a), None)
            acc_dims.append(f"block_{g.name}" if g is not None else str(int(d)))
        scratch = f"\n        scratch_shapes=[pltpu.VMEM(({', '.join(acc_dims)},), jnp.float32)],"
        shapes.append(f"({', '.join(acc_dims)},)")
        finish_shape = ", ".join([f"_partial({first}{_given(s_part)})"] + ([rest] if rest else [])) + _given(s_fin)
        eval_shape = f"jax.eval_shape(lambda {args}: _finish({finish_shape}), {args})"
    partial = f"functools.partial(_fused_kernel, {call_body + ', ' if call_body else ''}shapes=shapes)"
    after_statics = "" if p.tail is None else ", static" if p.tail.text else _given(_takes(p.after.values(), "_after"))
    return f'''{body}

def kernel({args}, **static):
    key = ({key}{',' if len(names) == 1 else ''})  # the shapes of what no grid axis splits
{find + nl if find and hoist is None else ""}    outs = {eval_shape}
    outs = outs if isinstance(outs, tuple) else (outs,)
{nl.join(extents)}
    shapes = ({', '.join(shapes)}{',' if len(shapes) == 1 else ''})
{find + nl if find and hoist is not None else ""}    results = pl.pallas_call(
        {partial},
        out_shape=({', '.join(out_shapes)},),
        grid=({steps},),
        in_specs=[{(',' + nl + '                  ').join(in_specs)}],
        out_specs=({', '.join(out_specs)},),{scratch}
        compiler_params=pltpu.CompilerParams(dimension_semantics=({semantics},){limit}),
    )({', '.join(operands)})
    {"after = _after_for(key)(" + reads + after_statics + ")" + nl + "    " if p.tail is not None else ""}return {returned}
'''


def _acc_axis(p: "FusedPlan", g: Any) -> int | None:
    """Which axis of the split matmul's product carries the parallel axis ``g`` (matched by extent and
    order: the product's axes are the outputs' before the epilogue)."""
    from maxkernel.sketches.axes import analyse_axes, axis_of

    assert p.split is not None
    axes = analyse_axes(p.program, split=p.split.dot)
    label = axes.label(p.outputs[0], g.out_axes[0])
    return axis_of(axes, p.split.dot.out, label)
