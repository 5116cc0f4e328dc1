"""Paged decode attention for NVIDIA GPUs in Pallas (Triton): one program instance per (sequence, kv head).

The instance holds its kv head's group of query heads (padded to 16 rows, the smallest tile Triton's dot
takes), reads its sequence's length, and walks the page table ``pages_per_block`` pages at a time up to
the block holding the last key: each trip gathers those pages' keys and values, scores them on the tensor
cores, masks the keys at or past the length and folds them into an online softmax (f32 statistics). The
BlockSpec windows name the kv head's whole cache (a pointer on Triton); only the visited pages are loaded.
Matching is :func:`maxkernel.rewrites.paged.match_paged`'s (the dense reference's structure).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from maxkernel.analysis.program import arg_names, trace_program
from maxkernel.rewrites.emit import EmitError, dtype_expr
from maxkernel.rewrites.paged import PagedRoles, match_paged
from maxkernel.templates.base import TemplateSpace
from maxkernel.templates.gpu_base import (
    GPU_STAGES,
    GPU_WARPS,
    TRITON_SMEM_PLAN,
    backend_import,
    compiler_params_text,
    power_of_two,
    refusal,
    triton_backend,
)

if TYPE_CHECKING:
    from jaxbench.task import Task
    from maxkernel.analysis import TaskAnalysis

PAGES_PER_BLOCK = (1, 2, 4, 8, 16)
MIN_DOT_ROWS = 16


def _shape(task: "Task", size: str) -> tuple[PagedRoles, dict[str, tuple[int, ...]], int] | str:
    """The paged roles, the inputs' shapes and the pages' itemsize at ``size``, or why the template does not apply."""
    program = trace_program(task, size).dce()
    roles = match_paged(program)
    if isinstance(roles, str):
        return roles
    shapes = {v.name: tuple(int(d) for d in v.shape) for v in program.inputs}
    _, q_heads, head_dim = shapes[roles.q]
    kv_heads, _, page_size, _ = shapes[roles.k_pages]
    if not all(power_of_two(n) for n in (head_dim, page_size, shapes[roles.page_table][1])):
        return "Triton needs power-of-two head size, page size and pages per sequence"
    item = next(np.dtype(v.dtype).itemsize for v in program.inputs if v.name == roles.k_pages)
    return roles, shapes, item


class GpuPagedDecodeTemplate:
    name = "gpu_paged_decode"
    description = ("paged decode attention for GPUs: a program per (sequence, kv head) gathers its pages block "
                   "by block up to the sequence's length, tensor-core scores, online softmax")

    def applies(self, task: "Task", analysis: "TaskAnalysis") -> str | None:
        return refusal(_shape(task, size) for size in ("cpu", "full"))

    def space(self, task: "Task", analysis: "TaskAnalysis", target: str) -> TemplateSpace:
        found = _shape(task, "full")
        assert not isinstance(found, str)
        roles, shapes, item = found
        per_seq = min(_per_seq(task, size) for size in ("cpu", "full"))
        fits = [(p, st) for p in PAGES_PER_BLOCK if p <= per_seq for st in GPU_STAGES
                if smem_bytes(roles, shapes, item, p, st) <= TRITON_SMEM_PLAN]
        blocks = sorted({p for p, _ in fits})
        # Default: 32 keys per trip, 2 stages. Decode is memory-bound: small trips keep several instances
        # resident per SM to hide the gathers' latency.
        page_size = shapes[roles.k_pages][2]
        default = max((p for p in blocks if p * page_size <= 32), default=blocks[0])
        defaults = {"pages_per_block": default, "num_warps": 4, "num_stages": 2, "backend": "triton"}
        return TemplateSpace(defaults=defaults, space={"pages_per_block": blocks, "num_warps": list(GPU_WARPS),
                                                       "num_stages": sorted({st for _, st in fits}),
                                                       "backend": ["triton"]})

    def render(self, task: "Task", params: dict[str, Any], sizes: tuple[str, ...]) -> str:
        backend = triton_backend(params, "paged decode")
        found = [_shape(task, s) for s in sizes]
        failed = refusal(found)
        if failed is not None:
            raise EmitError(failed)
        roles = found[0][0]  # type: ignore[index]
        scales = {shapes[r.q]: r.scale for r, shapes, _ in found}  # type: ignore[misc]
        compiler = compiler_params_text(backend, int(params["num_warps"]), int(params["num_stages"]))
        names = arg_names(task)
        return render_source(task.id, names, roles, scales, int(params["pages_per_block"]), backend, compiler)


def smem_bytes(roles: PagedRoles, shapes: dict[str, tuple[int, ...]], item: int, pages: int, stages: int) -> int:
    """Shared memory of one instance: each trip's page ids, keys and values ``stages`` deep, the padded
    query group and the length once."""
    kv_heads, _, page_size, head_dim = shapes[roles.k_pages]
    group = shapes[roles.q][1] // kv_heads
    rows = max(MIN_DOT_ROWS, 1 << (group - 1).bit_length())
    return stages * (2 * pages * page_size * head_dim * item + 4 * pages) + rows * head_dim * item + 4


def _per_seq(task: "Task", size: str) -> int:
    found = _shape(task, size)
    assert not isinstance(found, str)
    return found[1][found[0].page_table][1]


def render_source(task_id: str, names: list[str], roles: PagedRoles, scales: dict[tuple[int, ...], float],
                  pages_per_block: int, backend: str, compiler: str) -> str:
    return f'''"""{task_id}: paged decode attention for NVIDIA GPUs ({backend}): a program per (sequence, kv head)
walks the sequence's pages {pages_per_block} at a time up to its length with an online softmax. {compiler}.
Generated by MaxKernel's rules brain."""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
{backend_import(backend)}

PAGES_PER_BLOCK = {pages_per_block}
MIN_ROWS = {MIN_DOT_ROWS}  # Triton's dot takes tiles of at least 16 rows: query groups are padded to it
SCALES = {tuple(scales.items())!r}  # the reference's score scale, per query shape


def _decode_body(q_ref, k_ref, v_ref, table_ref, length_ref, o_ref, *, pages, page_size, scale):
    keys = pages * page_size
    length = length_ref[0]
    q = q_ref[...]
    rows, d = q.shape

    def step(j, carry):
        acc, m, l = carry
        page_ids = table_ref[pl.ds(j * pages, pages)]
        k = k_ref[page_ids].reshape(keys, d)
        v = v_ref[page_ids].reshape(keys, d)
        s = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32) * scale
        position = j * keys + jax.lax.broadcasted_iota(jnp.int32, (rows, keys), 1)
        s = jnp.where(position < length, s, -jnp.inf)
        m_new = jnp.maximum(m, jnp.max(s, axis=1))
        p = jnp.exp(s - m_new[:, None])
        alpha = jnp.exp(m - m_new)
        acc = acc * alpha[:, None] + jnp.dot(p.astype(v.dtype), v, preferred_element_type=jnp.float32)
        return acc, m_new, alpha * l + jnp.sum(p, axis=1)

    init = (jnp.zeros((rows, d), jnp.float32), jnp.full((rows,), -jnp.inf, jnp.float32),
            jnp.zeros((rows,), jnp.float32))
    acc, _, l = jax.lax.fori_loop(0, (length + keys - 1) // keys, step, init)
    o_ref[...] = (acc / l[:, None]).astype(o_ref.dtype)


def kernel({", ".join(names)}):
    q, k_pages, v_pages, table, lengths = {roles.q}, {roles.k_pages}, {roles.v_pages}, {roles.page_table}, {roles.lengths}
    batch, q_heads, d = q.shape
    kv_heads, total_pages, page_size, _ = k_pages.shape
    group = q_heads // kv_heads
    rows = max(MIN_ROWS, 1 << (group - 1).bit_length())
    per_seq = table.shape[1]
    pages = min(PAGES_PER_BLOCK, per_seq)
    grouped = jnp.pad(q.reshape(batch, kv_heads, group, d), ((0, 0), (0, 0), (0, rows - group), (0, 0)))
    body = functools.partial(_decode_body, pages=pages, page_size=page_size, scale=dict(SCALES)[q.shape])
    out = pl.pallas_call(
        body,
        grid=(batch, kv_heads),
        in_specs=[
            pl.BlockSpec((None, None, rows, d), lambda b, h: (b, h, 0, 0)),
            pl.BlockSpec((None, total_pages, page_size, d), lambda b, h: (h, 0, 0, 0)),
            pl.BlockSpec((None, total_pages, page_size, d), lambda b, h: (h, 0, 0, 0)),
            pl.BlockSpec((None, per_seq), lambda b, h: (b, 0)),
            pl.BlockSpec((1,), lambda b, h: (b,)),
        ],
        out_specs=pl.BlockSpec((None, None, rows, d), lambda b, h: (b, h, 0, 0)),
        out_shape=jax.ShapeDtypeStruct((batch, kv_heads, rows, d), {dtype_expr(roles.out_dtype)}),
        compiler_params={compiler},
    )(grouped, k_pages, v_pages, table, lengths)
    return out[:, :, :group].reshape(batch, q_heads, d)
'''


GPU_PAGED_DECODE = GpuPagedDecodeTemplate()
