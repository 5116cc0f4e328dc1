"""Tiled matmul with the reference's fused epilogue for NVIDIA GPUs (Triton backend).

A GPU grid's program instances run concurrently and cannot carry an accumulator from one grid step to the
next as the TPU template's K axis does, so the grid is (M tiles, N tiles) and each instance walks K itself:
its BlockSpec windows name the whole depth of its x rows and weight columns, and a loop loads (bm, bk) and
(bk, bn) slices of them (software-pipelined ``num_stages`` deep through shared memory) into an f32
accumulator held in registers. The reference's epilogue (bias, scale, activations, clamps, residual adds)
then runs on the accumulator and the tile is written once. The weight stays in its stored layout.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from maxkernel.analysis.program import arg_names, trace_program
from maxkernel.rewrites.emit import EmitError, dtype_expr, emit_function
from maxkernel.templates.base import TemplateSpace, divisors, pick_block
from maxkernel.templates.gpu_base import (
    GPU_STAGES,
    GPU_WARPS,
    TRITON_SMEM_PLAN,
    backend_import,
    compiler_params_text,
    gpu_target,
    power_of_two,
)
from maxkernel.templates.matmul import MATMUL, MatmulShape, _precision, block_epilogue, match

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
    if not all(power_of_two(d) for d in (found.m, found.n, found.k)):
        return "Triton needs power-of-two matmul extents (every block must be a power of two)"
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
        for size in ("cpu", "full"):
            found = _shape(task, size)
            if isinstance(found, str):
                return found
        return None

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
        backend = str(params.get("backend", "triton"))
        if backend != "triton":
            raise EmitError("the GPU matmul template emits Triton bodies only")
        compiler = compiler_params_text(backend, int(params["num_warps"]), int(params["num_stages"]))
        names = arg_names(task)
        parts = [f'"""{task.id}: {self.description}.\n\nblock_m={params["block_m"]}, block_n={params["block_n"]}, '
                 f'block_k={params["block_k"]} (clamped to each size\'s extents); {compiler}. '
                 'Generated by MaxKernel\'s rules brain.\n"""\n',
                 "import jax\nimport jax.numpy as jnp\nfrom jax.experimental import pallas as pl\n"
                 f"{backend_import(backend)}\n"]
        dispatch = []
        for size in sizes:
            program = trace_program(task, size).dce()
            s = _shape(task, size)
            if isinstance(s, str):
                raise EmitError(s)
            bm = pick_block(s.m, divisors(s.m), int(params["block_m"]))
            bn = pick_block(s.n, divisors(s.n), int(params["block_n"]))
            bk = pick_block(s.k, divisors(s.k), int(params["block_k"]))
            parts.append(_render_size(s, size, bm, bn, bk, [v.name for v in program.inputs], compiler))
            dispatch.append((f"_matmul_{size}", tuple(v.shape for v in program.inputs)))
        from maxkernel.templates.rowblock import _dispatch

        parts.append(_dispatch(dispatch, names))
        if any(local in part for part in parts[2:] for local in ERF_CALLS.values()):
            parts.insert(2, ERF_SOURCE)
        return "\n".join(parts)


def _render_size(s: MatmulShape, size: str, bm: int, bn: int, bk: int, params: list[str], compiler: str) -> str:
    epi = block_epilogue(s, bm, bn)
    epilogue = emit_function(epi, f"_epilogue_{size}", f"The reference's epilogue on one ({bm}, {bn}) tile.")
    for call, local in ERF_CALLS.items():
        epilogue = epilogue.replace(call, local)
    lines = [epilogue, ""]
    extra_refs = "".join(f"{v.name}_ref, " for v, _ in s.extras)
    extra_loads = [f"{v.name}_ref[...]" for v, _ in s.extras]
    if s.w_nk:  # weight [N, K]: the window holds bn rows of the whole depth; contract both on dim 1
        w_slice, dn = "w_ref[:, pl.ds(kk * bk, bk)]", "(((1,), (1,)), ((), ()))"
        w_spec = f"pl.BlockSpec(({bn}, {s.k}), lambda i, j: (j, 0))"
    else:
        w_slice, dn = "w_ref[pl.ds(kk * bk, bk), :]", "(((1,), (0,)), ((), ()))"
        w_spec = f"pl.BlockSpec(({s.k}, {bn}), lambda i, j: (0, j))"
    lines += [
        f"def _kernel_{size}(x_ref, w_ref, {extra_refs}o_ref):",
        f"    bk = {bk}",
        "",
        "    def step(kk, acc):",
        "        x = x_ref[:, pl.ds(kk * bk, bk)]",
        f"        w = {w_slice}",
        f"        return acc + jax.lax.dot_general(x, w, {dn}, precision={_precision(s.dot)}, "
        "preferred_element_type=jnp.float32)",
        "",
        f"    acc = jax.lax.fori_loop(0, {s.k // bk}, step, jnp.zeros(({bm}, {bn}), jnp.float32))",
        f"    acc = acc.astype({dtype_expr(s.dot.out.dtype)})",
        f"    o_ref[...] = _epilogue_{size}({', '.join(['acc'] + extra_loads)}).astype(o_ref.dtype)",
        "",
    ]
    specs = [f"pl.BlockSpec(({bm}, {s.k}), lambda i, j: (i, 0))", w_spec]
    operands = [s.x.name, s.w.name]
    for v, kind in s.extras:
        specs.append(f"pl.BlockSpec(({bn},), lambda i, j: (j,))" if kind == "bias"
                     else f"pl.BlockSpec(({bm}, {bn}), lambda i, j: (i, j))")
        operands.append(v.name)
    lines += [
        f"def _matmul_{size}({', '.join(params)}):",
        "    return pl.pallas_call(",
        f"        _kernel_{size},",
        f"        out_shape=jax.ShapeDtypeStruct(({s.m}, {s.n}), {dtype_expr(np.dtype(s.epilogue.outputs[0].dtype))}),",
        f"        grid=({s.m // bm}, {s.n // bn}),",
        "        in_specs=[" + ", ".join(specs) + "],",
        f"        out_specs=pl.BlockSpec(({bm}, {bn}), lambda i, j: (i, j)),",
        f"        compiler_params={compiler},",
        f"    )({', '.join(operands)})",
    ]
    return "\n".join(lines) + "\n"


GPU_MATMUL = GpuMatmulTemplate()
