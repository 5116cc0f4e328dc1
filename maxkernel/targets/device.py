"""Telling JAX which TPU generation to trace and lower for on a machine that has none.

Mosaic asks ``pltpu.get_tpu_info()`` for chip details (tiling, supported matmul dtypes); with no TPU present
it reads them from the abstract device of the current abstract mesh. A one-device abstract mesh whose device
is the target chip makes tracing and ``jax.export(..., platforms=["tpu"])`` behave as for that generation.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from jax.sharding import AbstractDevice, AbstractMesh, AxisType, use_abstract_mesh

from maxkernel.targets.specs import TpuSpec


@contextmanager
def tpu_device(spec: TpuSpec) -> Iterator[None]:
    """Trace and lower inside this block as if the default device were one ``spec`` chip."""
    device = AbstractDevice(device_kind=spec.device_kind, num_cores=spec.cores_per_device, platform="tpu")
    mesh = AbstractMesh((1,), ("maxkernel_tpu",), axis_types=(AxisType.Auto,), abstract_device=device)
    with use_abstract_mesh(mesh):
        yield
