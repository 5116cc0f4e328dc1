"""Candidate sources (text, as the evaluator receives them) and task folders for the target tests.

The Pallas candidates never set ``interpret=``: the code under test only traces and lowers them.
"""

from __future__ import annotations

from pathlib import Path

from maxkernel.targets.calibration import tiled_matmul_source

MATMUL_TASK = {
    "task.yaml": """\
id: tgt_matmul
name: TiledMatmul
category: matmul
description: out = x @ y with bfloat16 inputs, float32 accumulation, bfloat16 output.
dtype: bfloat16
tolerance: {atol: 2.0e-2, rtol: 2.0e-2}
sizes:
  cpu: {m: 256, k: 512, n: 256}
  full: {m: 1024, k: 2048, n: 512}
""",
    "reference.py": """\
import jax
import jax.numpy as jnp


def get_inputs(key, *, m, k, n):
    kx, ky = jax.random.split(key)
    x = jax.random.normal(kx, (m, k), jnp.float32).astype(jnp.bfloat16)
    y = jax.random.normal(ky, (k, n), jnp.float32).astype(jnp.bfloat16)
    return (x, y), {}


def reference(x, y):
    return jnp.dot(x, y, preferred_element_type=jnp.float32).astype(jnp.bfloat16)
""",
}

RMSNORM_TASK = {
    "task.yaml": """\
id: tgt_rmsnorm
name: RowRMSNorm
category: normalization
description: y = x / sqrt(mean(x^2, axis=-1) + eps) * w over rows of a float32 matrix.
dtype: float32
tolerance: {atol: 1.0e-5, rtol: 1.0e-5}
sizes:
  cpu: {rows: 256, hidden: 1024}
  full: {rows: 4096, hidden: 1024}
""",
    "reference.py": """\
import jax
import jax.numpy as jnp


def get_inputs(key, *, rows, hidden):
    kx, kw = jax.random.split(key)
    x = jax.random.normal(kx, (rows, hidden), jnp.float32)
    w = 1.0 + 0.1 * jax.random.normal(kw, (hidden,), jnp.float32)
    return (x, w), {"eps": 1e-6}


def reference(x, w, *, eps):
    ms = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
    return x * jax.lax.rsqrt(ms + eps) * w
""",
}

GATHER_TASK = {
    "task.yaml": """\
id: tgt_gather
name: RowGather
category: gather
description: out[b] = table[idx[b]] for a small float32 table of (8, 128) tiles and int32 row indices.
dtype: float32
tolerance: {atol: 1.0e-6, rtol: 1.0e-6}
sizes:
  cpu: {rows: 4, batch: 256}
  full: {rows: 4, batch: 512}
""",
    "reference.py": """\
import jax
import jax.numpy as jnp


def get_inputs(key, *, rows, batch):
    kt, ki = jax.random.split(key)
    table = jax.random.normal(kt, (rows, 8, 128), jnp.float32)
    idx = jax.random.randint(ki, (batch,), 0, rows, jnp.int32)
    return (table, idx), {}


def reference(table, idx):
    return table[idx]
""",
}


def write_task(folder: Path, files: dict[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


def matmul_source(bm: int, bn: int, bk: int, vmem_limit: int | None = None) -> str:
    """Tiled matmul: grid (m/bm, n/bn, k/bk), f32 accumulator in VMEM scratch, k innermost (the kernel the
    calibration against the Pallas TPU matmul guide prices)."""
    params = None if vmem_limit is None else f"pltpu.CompilerParams(vmem_limit_bytes={vmem_limit})"
    return tiled_matmul_source(bm, bk, bn, params)


def rmsnorm_source(block_rows: int, vmem_limit: int | None = None) -> str:
    """Row-wise RMSNorm: grid over row blocks; the weight's block index never changes (fetched once)."""
    params = "" if vmem_limit is None else f"compiler_params=pltpu.CompilerParams(vmem_limit_bytes={vmem_limit}),"
    return f'''\
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BR = {block_rows}


def _body(x_ref, w_ref, o_ref, *, eps):
    x = x_ref[...]
    ms = jnp.sum(x * x, axis=-1, keepdims=True) * (1.0 / x.shape[-1])
    o_ref[...] = x * jax.lax.rsqrt(ms + eps) * w_ref[...]


def kernel(x, w, *, eps):
    rows, hidden = x.shape
    return pl.pallas_call(
        lambda x_ref, w_ref, o_ref: _body(x_ref, w_ref, o_ref, eps=eps),
        grid=(rows // BR,),
        in_specs=[pl.BlockSpec((BR, hidden), lambda i: (i, 0)),
                  pl.BlockSpec((hidden,), lambda i: (0,))],
        out_specs=pl.BlockSpec((BR, hidden), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        {params}
    )(x, w)
'''


SEVEN_BY_SEVEN = '''\
import jax
from jax.experimental import pallas as pl


def _body(x_ref, w_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0


def kernel(x, w, *, eps):
    rows, hidden = x.shape
    return pl.pallas_call(
        _body,
        grid=(rows // 7, hidden // 7),
        in_specs=[pl.BlockSpec((7, 7), lambda i, j: (i, j)),
                  pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec((7, 7), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x, w)
'''

PLAIN_JAX_RMSNORM = '''\
import jax
import jax.numpy as jnp


def kernel(x, w, *, eps):
    inv = jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)
    return x * inv * w
'''

GATHER_PREFETCH = '''\
import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def _body(idx_ref, t_ref, o_ref):
    o_ref[...] = t_ref[...]


def kernel(table, idx):
    rows, sub, lanes = table.shape
    batch = idx.shape[0]
    return pl.pallas_call(
        _body,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=(batch,),
            in_specs=[pl.BlockSpec((None, sub, lanes), lambda b, idx_ref: (idx_ref[b], 0, 0))],
            out_specs=pl.BlockSpec((None, sub, lanes), lambda b, idx_ref: (b, 0, 0)),
        ),
        out_shape=jax.ShapeDtypeStruct((batch, sub, lanes), table.dtype),
    )(idx, table)
'''


def rmsnorm_with_glue_source(block_rows: int) -> str:
    """The row-wise kernel fed a copy of x computed by XLA outside the kernel (priced as glue)."""
    return rmsnorm_source(block_rows).replace("    )(x, w)\n", "    )(x * 0.5, w) * 2.0\n")


def rmsnorm_in_scan_source(block_rows: int, repeats: int) -> str:
    """The row-wise kernel applied ``repeats`` times inside ``lax.scan`` (the kernel runs in a loop)."""
    return rmsnorm_source(block_rows).replace("def kernel(x, w, *, eps):", "def _once(x, w, *, eps):") + f'''

def kernel(x, w, *, eps):
    def step(carry, _):
        return _once(carry, w, eps=eps), None

    out, _ = jax.lax.scan(step, x, None, length={repeats})
    return out
'''


def with_parallel_grid(source: str, semantics: tuple[str, ...]) -> str:
    """The same matmul candidate with ``dimension_semantics`` set (megacore chips split parallel dims)."""
    return source.replace(
        "scratch_shapes=[pltpu.VMEM((BM, BN), jnp.float32)],",
        f"scratch_shapes=[pltpu.VMEM((BM, BN), jnp.float32)],\n"
        f"        compiler_params=pltpu.CompilerParams(dimension_semantics={semantics!r}),")


def dma_into_scratch_slice_source(block_rows: int) -> str:
    """Row blocks copied by hand from HBM into one slot of a two-slot VMEM scratch (``buf.at[slot]``)."""
    return f'''\
import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BR = {block_rows}


def _body(x_hbm, w_ref, o_ref, buf, sem):
    i = pl.program_id(0)
    slot = i % 2
    copy = pltpu.make_async_copy(x_hbm.at[pl.ds(i * BR, BR)], buf.at[slot], sem.at[slot])
    copy.start()
    copy.wait()
    o_ref[...] = buf[slot] * w_ref[...]


def kernel(x, w, *, eps):
    rows, hidden = x.shape
    return pl.pallas_call(
        _body,
        grid=(rows // BR,),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY), pl.BlockSpec((hidden,), lambda i: (0,))],
        out_specs=pl.BlockSpec((BR, hidden), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_shapes=[pltpu.VMEM((2, BR, hidden), x.dtype), pltpu.SemaphoreType.DMA((2,))],
    )(x, w)
'''


def nested_when_matmul_source(bm: int, bn: int, bk: int) -> str:
    """The tiled matmul whose last-k store holds a second ``pl.when`` (only on the first row of blocks)."""
    return matmul_source(bm, bn, bk).replace(
        "        o_ref[...] = acc_ref[...].astype(o_ref.dtype)\n",
        "        o_ref[...] = acc_ref[...].astype(o_ref.dtype)\n\n"
        "        @pl.when(pl.program_id(0) == 0)\n"
        "        def _first_row():\n"
        "            o_ref[...] = (acc_ref[...] * 2.0).astype(o_ref.dtype)\n")


def _row_block_kernel(body: str, block_rows: int) -> str:
    """A kernel over row blocks of x with the weight as one block, around the given ``_body`` source."""
    return f'''\
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BR = {block_rows}

{body}

def kernel(x, w, *, eps):
    rows, hidden = x.shape
    return pl.pallas_call(
        _body,
        grid=(rows // BR,),
        in_specs=[pl.BlockSpec((BR, hidden), lambda i: (i, 0)), pl.BlockSpec((hidden,), lambda i: (0,))],
        out_specs=pl.BlockSpec((BR, hidden), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x, w)
'''


def triangular_loop_source(block_rows: int) -> str:
    """Row blocks where step i runs a ``fori_loop`` of i + 1 trips (a traced bound: a while loop)."""
    return _row_block_kernel('''
def _body(x_ref, w_ref, o_ref):
    x = x_ref[...]

    def trip(_, acc):
        return acc + x * 2.0

    o_ref[...] = jax.lax.fori_loop(0, pl.program_id(0) + 1, trip, x) * w_ref[...]
''', block_rows)


# A loop that runs until the data says stop: its trip count cannot be bounded from the inputs.
DATA_LOOP = _row_block_kernel('''
def _body(x_ref, w_ref, o_ref):
    x = x_ref[...]

    def more(carry):
        return jnp.sum(carry) < 1.0e6

    o_ref[...] = jax.lax.while_loop(more, lambda c: c * 2.0, x) * w_ref[...]
''', 256)


def vmapped_when_source(batch: int, block_rows: int) -> str:
    """A row-block kernel with a ``pl.when(program_id(0) == 0)``, run under ``jax.vmap`` over ``batch`` slabs:
    the kernel's axis 0 is the grid's axis 1."""
    return f'''\
import jax
from jax.experimental import pallas as pl

B, BR = {batch}, {block_rows}


def _body(x_ref, o_ref):
    o_ref[...] = x_ref[...]

    @pl.when(pl.program_id(0) == 0)
    def _first():
        o_ref[...] = x_ref[...] * 3.0


def _one(x):
    rows, hidden = x.shape
    return pl.pallas_call(
        _body,
        grid=(rows // BR,),
        in_specs=[pl.BlockSpec((BR, hidden), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((BR, hidden), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x)


def kernel(x, w, *, eps):
    rows, hidden = x.shape
    return jax.vmap(_one)(x.reshape(B, rows // B, hidden)).reshape(rows, hidden) * w
'''


PAGED_ATTENTION_EXPERT = '''\
from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention


def kernel(q, k_pages, v_pages, page_table, lengths):
    return paged_attention(q, k_pages, v_pages, lengths, page_table, pages_per_compute_block=64)
'''

MEGABLOX_GMM_EXPERT = '''\
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.megablox import gmm


def kernel(lhs, group_sizes, rhs):
    return gmm(lhs, rhs, group_sizes, preferred_element_type=jnp.bfloat16, tiling=(512, 1024, 1024))
'''

PLAIN_JAX_TILE_LOOP = '''\
import jax
import jax.numpy as jnp

T = 16


def kernel(lhs, group_sizes, rhs):
    """Group 0's rows, 16 at a time, in a fori_loop whose bound is data (a while loop)."""
    tiles = (group_sizes[0] + T - 1) // T
    out = jnp.zeros((lhs.shape[0], rhs.shape[2]), jnp.float32)

    def tile(i, out):
        rows = jax.lax.dynamic_slice_in_dim(lhs, i * T, T)
        part = jnp.dot(rows, rhs[0], preferred_element_type=jnp.float32)
        return jax.lax.dynamic_update_slice_in_dim(out, part, i * T, 0)

    return jax.lax.fori_loop(0, tiles, tile, out).astype(jnp.bfloat16)
'''

PLAIN_JAX_DATA_LOOP = '''\
import jax
import jax.numpy as jnp


def kernel(x, w, *, eps):
    return jax.lax.while_loop(lambda y: jnp.max(y) < 100.0, lambda y: y * 2.0, x) * w
'''

RAGGED_PAGED_ATTENTION_EXPERT = '''\
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.ragged_paged_attention import ragged_paged_attention


def kernel(q, k_pages, v_pages, kv_lens, page_indices, cu_q_lens, *, sm_scale, max_q_len):
    num_pages, page_size, kv_heads, head_dim = k_pages.shape
    kv = jnp.stack([k_pages, v_pages], axis=3).reshape(num_pages, page_size, 2 * kv_heads, head_dim)
    num_seqs = jnp.array([kv_lens.shape[0]], jnp.int32)
    return ragged_paged_attention(q, kv, kv_lens, page_indices, cu_q_lens, num_seqs, sm_scale=sm_scale,
                                  num_kv_pages_per_block=16, num_queries_per_block=32)
'''
