"""The GPU model follows loops that a small input bounds per grid cell (a sequence's length, a row tile's
groups) and charges a Triton kernel for what its body loads: the paged decode and grouped matmul templates
are priced for the trips each cell really makes on the model's drawn inputs."""

from __future__ import annotations

import pytest
import jax
import numpy as np

from jaxbench.task import load_task
from maxkernel.analysis import analyze_task
from maxkernel.targets.gpu_model import model_gpu_candidate
from maxkernel.targets.prefetch import PREFETCH_SEED
from maxkernel.templates.gpu_gmm import GPU_GROUPED_MATMUL
from maxkernel.templates.gpu_paged import GPU_PAGED_DECODE


def _drawn(task_id: str, index: int) -> np.ndarray:
    """One small input of the task at ``full`` size as the model draws it (nothing large is materialised)."""
    task = load_task(task_id)
    return np.asarray(jax.jit(lambda key: task.get_inputs(key, "full")[0][index])(jax.random.key(PREFETCH_SEED)))


def test_paged_decode_is_charged_for_the_pages_below_each_length() -> None:
    task = load_task("6p_Paged_Attention")
    params = {"pages_per_block": 2, "num_warps": 4, "num_stages": 2}
    (kernel,) = model_gpu_candidate(GPU_PAGED_DECODE.render(task, params, ("cpu", "full")), task, "h100").kernels
    lengths = _drawn("6p_Paged_Attention", 4)  # full: batch 32, kv heads 8, head_dim 128, 16-token pages
    keys, rows, d, kv_heads = 2 * 16, 16, 128, 8
    trips = -(-lengths // keys)  # key blocks up to the one holding the last key, per sequence
    assert kernel.dot_flops == 2 * (2 * rows * keys * d) * kv_heads * int(trips.sum())
    # Bytes: each trip's keys, values and page ids; per instance its query block and length; the output tiles.
    loaded = kv_heads * int(trips.sum()) * (2 * keys * d * 2 + 2 * 4) + 32 * kv_heads * (rows * d * 2 + 4)
    assert kernel.bytes == loaded + 32 * kv_heads * rows * d * 2
    # The windows name each kv head's whole key and value cache: under half of that is read.
    assert kernel.bytes < 2 * 8 * 10240 * 16 * 128 * 2 / 2


@pytest.mark.slow
def test_grouped_matmul_multiplies_each_tile_once_per_group_it_touches() -> None:
    task = load_task("11p_Megablox_GMM")
    space = GPU_GROUPED_MATMUL.space(task, analyze_task(task), "gpu-h100")
    bm, bn, bk = (space.defaults[k] for k in ("block_m", "block_n", "block_k"))
    source = GPU_GROUPED_MATMUL.render(task, space.defaults, ("cpu", "full"))
    (kernel,) = model_gpu_candidate(source, task, "h100").kernels
    sizes = _drawn("11p_Megablox_GMM", 1)  # full: m 16384, k 4096, n 14336, 8 groups
    ends = np.cumsum(sizes)
    starts = ends - sizes
    tile_start = np.arange(16384 // bm)[:, None] * bm
    touched = ((starts[None, :] < tile_start + bm) & (ends[None, :] > tile_start)).sum(axis=1)
    assert kernel.dot_flops == int(touched.sum()) * (14336 // bn) * 2 * bm * bn * 4096
    assert touched.sum() <= 16384 // bm + 8 - 1 + int((sizes == 0).sum())  # far from every tile times every group
    assert bk in space.space["block_k"]
