"""The cost model against published TPU measurements: the Pallas TPU matmul guide's table on v5e.

JAX's Pallas guide "Matrix Multiplication" times a plain tiled matmul (bf16 in, an f32 VMEM accumulator
over a k grid axis) and ``jnp.matmul`` on a TPU v5e and reports the fraction of bf16 peak each reaches.
:func:`calibration_rows` prices the same programs with the model; ``python -m
maxkernel.targets.calibration`` prints the table (it is the one in docs/targets-tpu.md). The model's fitted
constants (``step_overhead_s``, ``model.dispatch_overhead_s``, ``model.xla_matmul``) come from these rows.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from pydantic import BaseModel

from jaxbench.task import load_task
from maxkernel.targets.model import model_candidate, model_reference
from maxkernel.targets.specs import load_tpu_spec

# (program, blocks (bm, bk, bn), size, fraction of peak published for v5e, bf16)
PUBLISHED: tuple[tuple[str, tuple[int, int, int] | None, int, float], ...] = (
    ("pallas", (128, 128, 128), 1024, 0.037),
    ("pallas", (128, 128, 128), 4096, 0.059),
    ("pallas", (128, 128, 128), 8192, 0.061),
    ("pallas", (512, 1024, 1024), 1024, 0.086),
    ("pallas", (512, 1024, 1024), 4096, 0.785),
    ("pallas", (512, 1024, 1024), 8192, 0.915),
    ("jnp.matmul", None, 1024, 0.091),
    ("jnp.matmul", None, 4096, 0.843),
    ("jnp.matmul", None, 8192, 0.923),
)
RELATIVE_TOLERANCE = 0.15  # rows published above 10% of peak
POINTS_TOLERANCE = 0.02  # rows published below: absolute, in fractions of peak

TASK_YAML = """\
id: calib_matmul_{n}
name: SquareMatmul
category: matmul
description: x @ y for square bfloat16 matrices, bfloat16 out (the Pallas TPU matmul guide's benchmark).
dtype: bfloat16
tolerance: {{atol: 2.0e-2, rtol: 2.0e-2}}
sizes:
  cpu: {{n: 256}}
  full: {{n: {n}}}
"""

REFERENCE = """\
import jax
import jax.numpy as jnp


def get_inputs(key, *, n):
    kx, ky = jax.random.split(key)
    x = jax.random.normal(kx, (n, n), jnp.float32).astype(jnp.bfloat16)
    y = jax.random.normal(ky, (n, n), jnp.float32).astype(jnp.bfloat16)
    return (x, y), {}


def reference(x, y):
    return jnp.matmul(x, y)
"""

def tiled_matmul_source(bm: int, bk: int, bn: int, compiler_params: str | None = None) -> str:
    """The guide's kernel as candidate source: grid (m/bm, n/bn, k/bk), k innermost, bf16 blocks multiplied
    into an f32 VMEM accumulator that is zeroed on the first k step and written out on the last.
    ``compiler_params`` is the text of a ``pltpu.CompilerParams(...)`` to pass, if any."""
    params = "" if compiler_params is None else f"compiler_params={compiler_params},"
    return f'''\
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BM, BN, BK = {bm}, {bn}, {bk}


def _body(x_ref, y_ref, o_ref, acc_ref):
    @pl.when(pl.program_id(2) == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

    @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
    def _store():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def kernel(x, y):
    m, k = x.shape
    n = y.shape[1]
    return pl.pallas_call(
        _body,
        grid=(m // BM, n // BN, k // BK),
        in_specs=[pl.BlockSpec((BM, BK), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((BK, BN), lambda i, j, kk: (kk, j))],
        out_specs=pl.BlockSpec((BM, BN), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        scratch_shapes=[pltpu.VMEM((BM, BN), jnp.float32)],
        {params}
    )(x, y)
'''


class CalibrationRow(BaseModel):
    program: str
    blocks: tuple[int, int, int] | None
    size: int
    published: float
    modelled: float
    modelled_ms: float

    @property
    def within(self) -> bool:
        """Within the stated error: 15% relative above 10% of peak, 2 points of peak below."""
        if self.published > 0.10:
            return abs(self.modelled - self.published) <= RELATIVE_TOLERANCE * self.published
        return abs(self.modelled - self.published) <= POINTS_TOLERANCE


def calibration_rows(generation: str = "v5e") -> list[CalibrationRow]:
    """Every published row priced by the model (abstract shapes only: nothing is allocated)."""
    spec = load_tpu_spec(generation)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for program, blocks, size, published in PUBLISHED:
            folder = Path(tmp) / f"calib_{size}"
            if not folder.exists():
                folder.mkdir()
                (folder / "task.yaml").write_text(TASK_YAML.format(n=size))
                (folder / "reference.py").write_text(REFERENCE)
            task = load_task(folder)
            if blocks is None:
                est = model_reference(task, generation)
            else:
                est = model_candidate(tiled_matmul_source(*blocks), task, generation)
            ideal_s = 2.0 * size**3 / spec.peak_bf16_flops
            rows.append(CalibrationRow(program=program, blocks=blocks, size=size, published=published,
                                       modelled=ideal_s / (est.time_ms / 1e3), modelled_ms=est.time_ms))
    return rows


def markdown_table(rows: list[CalibrationRow]) -> str:
    """The table as it appears in the docs (docs/targets-tpu.md)."""
    lines = ["| program | blocks (bm, bk, bn) | size | published % of peak | modelled % of peak | within |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        blocks = "—" if row.blocks is None else str(row.blocks)
        lines.append(f"| {row.program} | {blocks} | {row.size} | {100 * row.published:.1f} | "
                     f"{100 * row.modelled:.1f} | {'yes' if row.within else 'no'} |")
    return "\n".join(lines)


def main() -> None:
    print(markdown_table(calibration_rows()))


if __name__ == "__main__":
    main()
