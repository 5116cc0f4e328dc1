"""TPU row-block kernel: the whole reference, fused, on blocks of rows, one body for every size.

For references whose every output row depends only on the same row of its row-blocked inputs (RMSNorm,
LayerNorm, softmax, elementwise chains): each grid step reads ``BLOCK_ROWS`` rows (a multiple of 8, the
sublane tiling; the whole row on the lanes) and the inputs read whole (weights, biases), runs the
reference's own computation on them in VMEM and writes its rows once. The computation is written out as
JAX with its shapes read from its operands, so it runs on a block as on the whole array; where a constant
follows a size (a mean divides by the row width) one function is written for each width rendered. The
grid axis is ``parallel``. Unlike ``rowblock``, nothing is specialized for the argument shapes: the code
priced at ``full`` is the code checked at any smaller twin size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from maxkernel.analysis.program import Program, arg_names, trace_program
from maxkernel.analysis.statics import bind, used_statics
from maxkernel.rewrites.activations import cheaper_activations
from maxkernel.rewrites.emit import EmitError, emit_function, emittable
from maxkernel.templates.base import FIT_SOURCE, TPU_VMEM_BUDGET, TemplateSpace, tpu_target

if TYPE_CHECKING:
    from jaxbench.task import Task
    from maxkernel.analysis import TaskAnalysis

HEADER = ("import functools\nimport math\n\nimport jax\nimport jax.numpy as jnp\nfrom jax.experimental import pallas as pl\n"
          "from jax.experimental.pallas import tpu as pltpu\n")
TPU_BLOCK_ROWS = (8, 16, 32, 64, 128, 256, 512, 1024)
UNFUSABLE = ("scan", "while", "cond", "random_bits", "random_wrap", "gather", "scatter", "sort", "conv_general_dilated")


@dataclass
class RowsPlan:
    program: Program
    row_dims: int
    blocked: tuple[bool, ...]  # per input: shares the output's row axes
    variants: dict[tuple[tuple[int, ...], ...], str]  # per-row shapes -> emitted body (): one serves all


def _key(program: Program, row_dims: int, blocked: tuple[bool, ...]) -> tuple[tuple[int, ...], ...]:
    """What a body's constants may follow: every input's shape without its row axes."""
    return tuple(tuple(v.shape[row_dims:]) if b else tuple(v.shape) for v, b in zip(program.inputs, blocked))


def _name(index: int) -> str:
    return f"_reference_{index}"


def plan(task: "Task", analysis: "TaskAnalysis", sizes: tuple[str, ...]) -> RowsPlan | str:
    rows = analysis.rows
    if rows is None:
        return "output has no row axes shared with an input"
    if not rows.independent:
        return "output rows depend on other rows (e.g. statistics over the batch)"
    found: list[Program] = []
    texts: dict[tuple[tuple[int, ...], ...], str] = {}
    blocked = tuple(rows.blocked)
    from maxkernel.analysis.rows import block_probe

    for size in sizes:
        program = trace_program(task, size).dce()
        reason = block_probe(task, size, rows.row_dims, blocked)
        if reason is not None:
            return reason
        bad = sorted(set(program.primitives()) & set(UNFUSABLE))
        if bad:
            return f"{bad[0]} in the reference (no Mosaic lowering for it on row blocks)"
        if any(n.prim == "dot_general" for n in program.nodes):
            return "a matmul: each block would read the whole weight (the TPU GEMM template serves it)"
        cheaper_activations(program)  # erfc has no Mosaic lowering; 1 - erf has
        program.dce()
        reason = emittable(program)
        if reason is not None:
            return reason
        key = _key(program, rows.row_dims, blocked)
        text = emit_function(program, "_reference", "The reference on rows of its row-blocked inputs.", statics=True)
        if texts.setdefault(key, text) != text:
            return "the reference is written differently for the same row shapes"
        found.append(program)
    variants = {(): next(iter(texts.values()))} if len(set(texts.values())) == 1 else texts
    return RowsPlan(found[-1], rows.row_dims, blocked, variants)


def vmem_bytes(p: RowsPlan, block_rows: int) -> int:
    """Double-buffered row blocks of the blocked inputs and the output, plus the inputs read whole."""
    prog = p.program
    out = prog.outputs[0]
    rows = int(np.prod(out.shape[: p.row_dims], dtype=np.int64))
    per_row = int(np.prod(out.shape, dtype=np.int64)) // rows * np.dtype(out.dtype).itemsize
    whole = 0
    for v, b in zip(prog.inputs, p.blocked):
        nbytes = int(np.prod(v.shape, dtype=np.int64)) * np.dtype(v.dtype).itemsize
        if b:
            per_row += nbytes // rows
        else:
            whole += nbytes
    return 2 * (block_rows * per_row + whole)


class TpuRowsTemplate:
    name = "tpu_rows"
    description = "the fused reference on blocks of whole rows in VMEM (inputs read whole by every step)"

    def applies(self, task: "Task", analysis: "TaskAnalysis") -> str | None:
        found = plan(task, analysis, ("cpu", "full"))
        return found if isinstance(found, str) else None

    def space(self, task: "Task", analysis: "TaskAnalysis", target: str) -> TemplateSpace:
        if not tpu_target(target):
            return TemplateSpace(defaults={}, space={"block_rows": []})  # a TPU kernel
        p = plan(task, analysis, ("full",))
        assert not isinstance(p, str)
        out = p.program.outputs[0]
        rows = int(np.prod(out.shape[: p.row_dims], dtype=np.int64))
        options = [r for r in TPU_BLOCK_ROWS if rows % r == 0 and rows // r >= 2 and vmem_bytes(p, r) <= TPU_VMEM_BUDGET]
        if not options:
            return TemplateSpace(defaults={"block_rows": 0}, space={"block_rows": []})
        # Largest block first: fewest grid steps for the same bytes; the model orders the two.
        return TemplateSpace(defaults={"block_rows": options[-1]}, space={"block_rows": options[-2:]})

    def render(self, task: "Task", params: dict[str, Any], sizes: tuple[str, ...]) -> str:
        from maxkernel.analysis.rows import row_layout

        analysis = _RowsOnly(row_layout(task, "cpu"))
        p = plan(task, analysis, sizes)  # type: ignore[arg-type]
        if isinstance(p, str):
            raise EmitError(p)
        names = arg_names(task)[: len(p.program.inputs)]
        parts = [f'"""{task.id}: {self.description}.\n\nGenerated by MaxKernel\'s rules brain, '
                 f'{int(params["block_rows"])} rows a step.\n"""\n', HEADER,
                 f"BLOCK_ROWS = {int(params['block_rows'])}  # rows per grid step (a multiple of 8: the sublane tiling)",
                 f"ROW_DIMS = {p.row_dims}  # the output's leading axes that index a row", "", FIT_SOURCE, "",
                 _bodies_source(p), _kernel_source(p, names)]
        return "\n".join(parts)


@dataclass
class _RowsOnly:
    """What ``plan`` reads of an analysis, for rendering without re-analysing the task."""

    rows: Any


def _bodies_source(p: RowsPlan) -> str:
    if () in p.variants:
        return p.variants[()] + "\n\n\ndef _reference_for(shapes):\n    return _reference\n\n"
    keys = sorted(p.variants)
    bodies = [p.variants[k].replace("def _reference(", f"def {_name(i)}(", 1) for i, k in enumerate(keys)]
    checks = "".join(f"    if shapes == {k}:\n        return {_name(i)}\n" for i, k in enumerate(keys))
    return "\n\n".join(bodies) + f'''


def _reference_for(shapes):
    """Constants of the computation follow the row shapes (a mean divides by the row width): the function
    written for these shapes (every input's shape without its row axes)."""
{checks}    raise ValueError(f"written for row shapes {keys} only, not {{shapes}}")

'''


def _kernel_source(p: RowsPlan, names: list[str], partial_blocks: bool = False) -> str:
    """``kernel``: blocks fitted to divide the rows on a parallel TPU grid or, with ``partial_blocks``, a
    partial last block and no backend parameters (the CPU and GPU row-block template)."""
    lead = next(n for n, b in zip(names, p.blocked) if b)
    key = ", ".join(f"tuple({n}.shape[ROW_DIMS:])" if b else f"tuple({n}.shape)" for n, b in zip(names, p.blocked))
    shapes = ", ".join(f"(1,) * (ROW_DIMS - 1) + (block_rows,) + {n}.shape[ROW_DIMS:]" if b else f"{n}.shape"
                       for n, b in zip(names, p.blocked))
    specs = ", ".join(f"pl.BlockSpec((block_rows, _rows_of({n}).shape[1]), lambda i: (i, 0))" if b
                      else f"pl.BlockSpec(_whole({n}).shape, lambda i: (0, 0))" for n, b in zip(names, p.blocked))
    operands = ", ".join(f"_rows_of({n})" if b else f"_whole({n})" for n, b in zip(names, p.blocked))
    refs = ", ".join(f"{n}_ref" for n in names)
    loads = ", ".join(f"{n}_ref[...].reshape(shapes[{i}])" for i, n in enumerate(names))
    fit = "min(BLOCK_ROWS, rows)" if partial_blocks else "_fit(BLOCK_ROWS, rows)"
    grid = "pl.cdiv(rows, block_rows),),  # a partial last block: rows past the end are never written" if partial_blocks \
        else "rows // block_rows,),"
    statics = used_statics(p.program)
    bound = f"\n    body = functools.partial(body, {bind(statics)})  # the statics it reads" if statics else ""
    backend = "" if partial_blocks else '\n        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),'
    return f'''def _rows_kernel({refs}, o_ref, *, body, shapes):
    """The reference on one block of rows, held in VMEM; its rows written once."""
    o_ref[...] = body({loads}).reshape(o_ref.shape).astype(o_ref.dtype)


def _rows_of(a):
    """A row-blocked input as a 2-D array: its row axes flattened, then everything else."""
    return a.reshape((math.prod(a.shape[:ROW_DIMS]), -1))


def _whole(a):
    """An input read whole by every step, as a 2-D block (a vector travels as one row)."""
    return a.reshape((1, a.size)) if a.ndim < 2 else a.reshape((a.shape[0], -1))


def kernel({", ".join(names)}, **static):
    rows = math.prod({lead}.shape[:ROW_DIMS])
    block_rows = {fit}
    body = _reference_for(({key},)){bound}
    out = jax.eval_shape(body, {", ".join(names)})
    cols = math.prod(out.shape[ROW_DIMS:])
    result = pl.pallas_call(
        functools.partial(_rows_kernel, body=body, shapes=({shapes},)),
        out_shape=jax.ShapeDtypeStruct((rows, cols), out.dtype),
        grid=({grid}
        in_specs=[{specs}],
        out_specs=pl.BlockSpec((block_rows, cols), lambda i: (i, 0)),{backend}
    )({operands})
    return result.reshape(out.shape)
'''


TPU_ROWS = TpuRowsTemplate()
