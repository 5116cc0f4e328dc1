"""Tiled matmul with the reference's fused epilogue for NVIDIA GPUs (Triton backend).

A GPU grid's program instances run concurrently and cannot carry an accumulator from one grid step to the
next as the TPU template's K axis does, so the grid is (M tiles, N tiles) and each instance walks K itself:
its BlockSpec windows name the whole depth of its x rows and weight columns, and a loop loads (bm, bk) and
(bk, bn) slices of them (software-pipelined ``num_stages`` deep through shared memory) into an f32
accumulator held in registers. The reference's epilogue (bias, scale, activations, clamps, residual adds)
then runs on the accumulator and the tile is written once. The weight stays in its stored layout.

Shape-generic: M, N and K are read from the arguments. Tiles stay powers of two (Triton's blocks must be),
so a partial last tile is masked: its x rows and weight columns past the end load as zeros (the loads stay
inside the arrays on a GPU) and its store skips them. The contraction takes the largest power of two at
most ``BLOCK_K`` that divides K (padding is never summed); a K that is not a multiple of 16 is refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from maxkernel.analysis.program import arg_names, trace_program
from maxkernel.analysis.statics import keyword_only, passed_on, used_statics
from maxkernel.rewrites.emit import EmitError, dtype_expr, emit_function
from maxkernel.rewrites.source import size_dispatch
from maxkernel.templates.base import TemplateSpace
from maxkernel.templates.gpu_base import (
    GPU_STAGES,
    GPU_WARPS,
    TRITON_SMEM_PLAN,
    backend_import,
    compiler_params_text,
    gpu_target,
    power_of_two,
    refusal,
    triton_backend,
)
from maxkernel.templates.matmul import MATMUL, MatmulShape, _precision, match

if TYPE_CHECKING:
    from jaxbench.task import Task
    from maxkernel.analysis import TaskAnalysis

TILE_BLOCKS = (32, 64, 128, 256)  # output tile rows and columns
DEPTH_BLOCKS = (16, 32, 64, 128)  # depth per loop trip

# Triton has no erf/erfc: the exact GELU's erfc comes from Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7).
ERF_SOURCE = '''def _erfc(x):
    """erfc by Abramowitz & Stegun 7.1.26 (absolute error below 1.5e-7): Triton lowers no erf."""
    z = jnp.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * z)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    tail = poly * jnp.exp(-z * z)
    return jnp.where(x >= 0, tail, 2.0 - tail).astype(x.dtype)


def _erf(x):
    return (1.0 - _erfc(x)).astype(x.dtype)
'''
ERF_CALLS = {"jax.lax.erfc(": "_erfc(", "jax.lax.erf(": "_erf("}


def _shape(task: "Task", size: str) -> MatmulShape | str:
    found = match(trace_program(task, size).dce())
    if isinstance(found, str):
        return found
    if not all(power_of_two(d) for d in (found.m, found.n, found.k)):  # where the tuned tiles divide them
        return "the template is offered for power-of-two matmul extents (other sizes it serves by masking)"
    return found


def smem_bytes(s: MatmulShape, bm: int, bn: int, bk: int, stages: int) -> int:
    """Shared memory of one instance: the x and weight slices the K loop loads, ``stages`` deep."""
    return stages * (bm * bk + bk * bn) * np.dtype(s.x.dtype).itemsize


class GpuMatmulTemplate:
    name = "gpu_matmul_epilogue"
    description = ("tiled matmul for GPUs: a program per output tile loops over K into an f32 accumulator, "
                   "the reference's epilogue fused before the single store")

    def applies(self, task: "Task", analysis: "TaskAnalysis") -> str | None:
        reason = MATMUL.applies(task, analysis)
        if reason is not None:
            return reason
        return refusal(_shape(task, size) for size in ("cpu", "full"))

    def space(self, task: "Task", analysis: "TaskAnalysis", target: str) -> TemplateSpace:
        s = _shape(task, "full" if gpu_target(target) else "cpu")
        assert not isinstance(s, str)
        fits = [(bm, bn, bk, st) for bm in TILE_BLOCKS if bm <= s.m for bn in TILE_BLOCKS if bn <= s.n
                for bk in DEPTH_BLOCKS if bk <= s.k for st in GPU_STAGES
                if smem_bytes(s, bm, bn, bk, st) <= TRITON_SMEM_PLAN]
        space = {"block_m": sorted({f[0] for f in fits}), "block_n": sorted({f[1] for f in fits}),
                 "block_k": sorted({f[2] for f in fits}), "num_warps": list(GPU_WARPS),
                 "num_stages": sorted({f[3] for f in fits}), "backend": ["triton"]}
        # Default: Triton's matmul tutorial's 128x128 tile, a 32-deep (f32) or 64-deep (bf16) slice, 3 stages.
        bm, bn = min(128, s.m), min(128, s.n)
        bk = min(32 if np.dtype(s.x.dtype).itemsize >= 4 else 64, s.k)
        defaults = {"block_m": bm, "block_n": bn, "block_k": bk, "num_warps": 4, "num_stages": 3, "backend": "triton"}
        return TemplateSpace(defaults=defaults, space=space)

    def render(self, task: "Task", params: dict[str, Any], sizes: tuple[str, ...]) -> str:
        backend = triton_backend(params, "matmul")
        compiler = compiler_params_text(backend, int(params["num_warps"]), int(params["num_stages"]))
        names = arg_names(task)
        parts = [f'"""{task.id}: {self.description}.\n\nShapes are read from the arguments: tiles of BLOCK_M x BLOCK_N '
                 "(the last ones partial, masked on load and store), BLOCK_K of the contraction a loop trip; "
                 f'{compiler}. Generated by MaxKernel\'s rules brain.\n"""\n',
                 "import functools\n\nimport jax\nimport jax.numpy as jnp\nfrom jax.experimental import pallas as pl\n"
                 f"{backend_import(backend)}\n",
                 f"BLOCK_M = {int(params['block_m'])}  # output rows per program (a power of two, as Triton's blocks are)",
                 f"BLOCK_N = {int(params['block_n'])}  # output columns per program",
                 f"BLOCK_K = {int(params['block_k'])}  # the contraction per loop trip, halved until it divides K",
                 f"SMALLEST = {SMALLEST_BLOCK}  # Triton's dot takes no smaller tile",
                 "", "", TILE_SOURCE, "", ""]
        programs = {}
        for size in sizes:
            program = trace_program(task, size).dce()
            s = _shape(task, size)
            if isinstance(s, str):
                raise EmitError(s)
            programs[size] = (s, [v.name for v in program.inputs], tuple(v.shape for v in program.inputs))
        statics = used_statics(next(iter(programs.values()))[0].epilogue)
        generic = {size: _render_generic(s, "", params_, compiler) for size, (s, params_, _) in programs.items()}
        if len(set(generic.values())) == 1:  # every size emits the same code: one function serves them all
            parts.append(next(iter(generic.values())))
            parts.append(size_dispatch({"any": ("_matmul", ())}, names, statics=statics) + "\n")
        else:
            parts.extend(_render_generic(s, f"_{size}", params_, compiler) for size, (s, params_, _) in programs.items())
            parts.append(size_dispatch({size: (f"_matmul_{size}", shapes) for size, (_, _, shapes) in programs.items()},
                                       names, statics=statics) + "\n")
        if any(local in part for part in parts[2:] for local in ERF_CALLS.values()):
            parts.insert(2, ERF_SOURCE)
        return "\n".join(parts)


# Emitted into the candidate, which imports nothing of MaxKernel.
TILE_SOURCE = '''def _tile(extent):
    """Output tile along an extent: BLOCK_M or BLOCK_N, or the power of two (at least SMALLEST) that covers a
    shorter extent; the rows or columns of a partial tile past the extent are masked."""
    return max(SMALLEST, 1 << (extent - 1).bit_length())


def _depth_block(depth):
    """The largest power of two at most BLOCK_K that divides the contraction (padding is never summed)."""
    block = BLOCK_K
    while depth % block:
        block //= 2
    if block < SMALLEST:
        raise ValueError(f"a contraction of {depth} is not served: this kernel needs it a multiple of {SMALLEST}")
    return block'''
SMALLEST_BLOCK = 16


def _render_generic(s: MatmulShape, suffix: str, params: list[str], compiler: str) -> str:
    """The tiled kernel for any [M, K] x [K, N] (``suffix`` names a per-size copy): M, N and K read from the
    arguments; the epilogue, emitted at the traced shape, reads its shapes from its operands, so it runs on
    a tile as on the whole product."""
    statics = used_statics(s.epilogue)  # taken by _matmul and passed on to the epilogue
    epilogue = emit_function(s.epilogue, f"_epilogue{suffix}", "The reference's epilogue, on one tile of the product.",
                            statics=True)
    for call, local in ERF_CALLS.items():
        epilogue = epilogue.replace(call, local)
    lines = [epilogue, "", ""]
    extra_refs = "".join(f"{v.name}_ref, " for v, _ in s.extras)
    # A partial tile: rows past M and columns past N are never read (masked to zero) nor written.
    extra_loads = [f"plt.load({v.name}_ref, mask=col_ok.reshape((-1,)), other=0)" if kind == "bias"
                   else f"plt.load({v.name}_ref, mask=row_ok & col_ok, other=0)" for v, kind in s.extras]
    if s.w_nk:  # weight [N, K]: the window holds bn rows of the whole depth; contract both on dim 1
        w_load = "plt.load(w_ref.at[:, pl.ds(kk * bk, bk)], mask=col_ok.reshape((-1, 1)), other=0)"
        dn, w_spec = "(((1,), (1,)), ((), ()))", "pl.BlockSpec((bn, depth), lambda i, j: (j, 0))"
    else:
        w_load = "plt.load(w_ref.at[pl.ds(kk * bk, bk), :], mask=col_ok, other=0)"
        dn, w_spec = "(((1,), (0,)), ((), ()))", "pl.BlockSpec((depth, bn), lambda i, j: (0, j))"
    lines += [
        f"def _kernel{suffix}(x_ref, w_ref, {extra_refs}o_ref, *, rows, cols, depth, bk{''.join(', ' + n for n in statics)}):",
        "    bm, bn = o_ref.shape",
        "    row_ok = pl.program_id(0) * bm + jax.lax.broadcasted_iota(jnp.int32, (bm, 1), 0) < rows",
        "    col_ok = pl.program_id(1) * bn + jax.lax.broadcasted_iota(jnp.int32, (1, bn), 1) < cols",
        "",
        "    def step(kk, acc):",
        "        x = plt.load(x_ref.at[:, pl.ds(kk * bk, bk)], mask=row_ok, other=0)",
        f"        w = {w_load}",
        f"        return acc + jax.lax.dot_general(x, w, {dn}, precision={_precision(s.dot)}, "
        "preferred_element_type=jnp.float32)",
        "",
        "    acc = jax.lax.fori_loop(0, depth // bk, step, jnp.zeros((bm, bn), jnp.float32))",
        f"    acc = acc.astype({dtype_expr(s.dot.out.dtype)})",
        f"    out = _epilogue{suffix}({', '.join(['acc'] + extra_loads)}{passed_on(statics)}).astype(o_ref.dtype)",
        "    plt.store(o_ref, out, mask=row_ok & col_ok)",
        "",
        "",
    ]
    specs = ["pl.BlockSpec((bm, depth), lambda i, j: (i, 0))", w_spec]
    operands = [s.x.name, s.w.name]
    for v, kind in s.extras:
        specs.append("pl.BlockSpec((bn,), lambda i, j: (j,))" if kind == "bias"
                     else "pl.BlockSpec((bm, bn), lambda i, j: (i, j))")
        operands.append(v.name)
    lines += [
        f"def _matmul{suffix}({', '.join(params)}{keyword_only(statics)}):",
        f"    rows, depth = {s.x.name}.shape",
        f"    cols = {s.w.name}.shape[{0 if s.w_nk else 1}]",
        "    bm, bn = min(BLOCK_M, _tile(rows)), min(BLOCK_N, _tile(cols))",
        "    body = functools.partial(_kernel" + suffix + ", rows=rows, cols=cols, depth=depth, bk=_depth_block(depth)"
        + passed_on(statics) + ")",
        "    return pl.pallas_call(",
        "        body,",
        f"        out_shape=jax.ShapeDtypeStruct((rows, cols), {dtype_expr(np.dtype(s.epilogue.outputs[0].dtype))}),",
        "        grid=(pl.cdiv(rows, bm), pl.cdiv(cols, bn)),",
        "        in_specs=[" + ", ".join(specs) + "],",
        "        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),",
        f"        compiler_params={compiler},",
        f"    )({', '.join(operands)})",
    ]
    return "\n".join(lines) + "\n"


GPU_MATMUL = GpuMatmulTemplate()
