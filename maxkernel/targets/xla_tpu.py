"""Plain-JAX code priced by XLA:TPU itself: the program compiled for a TPU generation without a TPU.

With the optional ``tpu-compiler`` extra installed (``libtpu``, the TPU compiler JAX uses), a topology of the
generation is described without hardware (``jax.experimental.topologies.get_topology_desc``) and the program
is lowered with its arguments placed on one of its devices and compiled: the result is XLA:TPU's own
scheduled, fused program, and ``cost_analysis()["optimal_seconds"]`` is its estimate of that program's device
time on the generation, with XLA:TPU's fusion, layouts and matmul efficiency in it (``memory_analysis()``
gives its buffers). Without the extra, :func:`tpu_compiler` is None and the model falls back to XLA:CPU's
byte counts (``maxkernel.targets.xla_cost``), and says so.

XLA counts a loop body once (as the CPU path does): each top-level loop adds (trips - 1) times its body's
own compiled time, trip counts coming from the same records as the work counts.
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import jax
import numpy as np
from jax._src import core

from maxkernel.targets.control import Path
from maxkernel.targets.jaxpr_walk import CALL_PRIMITIVES

# A topology of each generation that libtpu can describe (the smallest slice it accepts); the first device
# of it is the one priced.
TOPOLOGIES = {"v4": "v4:2x2x1", "v5e": "v5e:2x2", "v5p": "v5p:2x2x1", "v6e": "v6e:2x2", "v7": "tpu7x:2x2x1"}
INSTALL_HINT = 'pip install "maxkernel[tpu-compiler]"'
# XLA:TPU's cost analysis counts an op it has no cost for (the layout helper ``ConcatBitcast`` behind a
# concatenation of async slices) as -1 s in ``optimal_seconds``. Not every custom call is one: a program with
# seven non-Mosaic custom calls (``AllocateBuffer``, ``AssumeGatherIndicesInBound``, ...) read -0.9994 s, one
# sentinel. So the sentinels are counted from the figure itself: the fewest whole seconds that make it
# non-negative (a program's own time here is under a second: the dearest reference of the suite and of the
# generated tasks is priced under 300 ms), never more than the program has custom calls. A program that
# cannot be explained so (a Pallas kernel: -1000 s) is not priced here.
UNCOSTED_SENTINEL_S = 1.0
UNCOSTED_CALL = re.compile(r"custom-call\(.*custom_call_target=\"(?!tpu_custom_call)")


def without_sentinels(seconds: float, custom_calls: int) -> float | None:
    """``optimal_seconds`` with its -1 s sentinels taken out, or None when the custom calls cannot explain it."""
    if seconds >= 0:
        return seconds
    count = math.ceil(-seconds / UNCOSTED_SENTINEL_S)
    return seconds + count * UNCOSTED_SENTINEL_S if count <= custom_calls else None


@dataclass(frozen=True)
class CompiledCost:
    """XLA:TPU's figures for one compiled program."""

    seconds: float  # cost_analysis()["optimal_seconds"], loop trips added
    bytes: float  # cost_analysis()["bytes accessed"]
    flops: float
    temp_bytes: int  # memory_analysis().temp_size_in_bytes


def compiler_installed() -> bool:
    """Whether the TPU compiler (``libtpu``) can be imported here."""
    return importlib.util.find_spec("libtpu") is not None


def compiler_used() -> bool:
    """Whether XLA code is priced by XLA:TPU's program: libtpu installed and not switched off
    (``MAXKERNEL_NO_TPU_COMPILER``, so a figure compares with runs made without it)."""
    return not os.environ.get("MAXKERNEL_NO_TPU_COMPILER") and compiler_installed()


STARTUP_ERRORS: dict[str, str] = {}  # generation -> why an installed TPU compiler could not be used


@lru_cache(maxsize=8)
def tpu_compiler(generation: str) -> Any | None:
    """A device of ``generation``'s topology to compile for, or None without the TPU compiler."""
    if not compiler_used() or generation not in TOPOLOGIES:
        return None
    from jax.experimental import topologies

    # Compiling needs no TPU, so the lock libtpu takes on one (a file in /tmp) must not stop two processes
    # that price at once; the second would otherwise fail and fall back.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    try:
        return topologies.get_topology_desc(platform="tpu", topology_name=TOPOLOGIES[generation]).devices[0]
    except Exception as exc:  # a libtpu that cannot describe the topology: the fallback prices the code
        STARTUP_ERRORS[generation] = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]}"
        return None


def compiled_cost(fn: Callable[..., Any], arg_shapes: Sequence[Any], device: Any) -> CompiledCost:
    """XLA:TPU's cost of ``fn`` at ``arg_shapes`` (abstract) compiled for ``device``."""
    sharding = jax.sharding.SingleDeviceSharding(device)
    placed = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), arg_shapes)
    compiled = jax.jit(fn).lower(*placed).compile()
    analysis = compiled.cost_analysis()
    if isinstance(analysis, (list, tuple)):
        analysis = analysis[0] if analysis else {}
    analysis = analysis or {}
    raw = float(analysis.get("optimal_seconds", 0.0 if "flops" not in analysis else -1.0))
    seconds = without_sentinels(raw, len(UNCOSTED_CALL.findall(compiled.as_text() or ""))) if raw < 0 else raw
    if seconds is None or not seconds >= 0:
        raise ValueError(f"XLA:TPU gives no time for this program (optimal_seconds {raw})")
    memory = compiled.memory_analysis()
    return CompiledCost(seconds=seconds, bytes=float(analysis.get("bytes accessed", 0.0)),
                        flops=float(analysis.get("flops", 0.0)),
                        temp_bytes=int(getattr(memory, "temp_size_in_bytes", 0) or 0))


def program_cost(closed: core.ClosedJaxpr, records: dict[Path, Any], device: Any) -> CompiledCost:
    """XLA:TPU's cost of a traced program, each top-level loop charged for the trips its records give."""
    shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in closed.in_avals]
    cost = compiled_cost(core.jaxpr_as_fun(closed), shapes, device)
    seconds, nbytes = loop_extra(closed.jaxpr, records, device)
    return CompiledCost(cost.seconds + seconds, cost.bytes + nbytes, cost.flops, cost.temp_bytes)


def loop_extra(jaxpr: core.Jaxpr, records: dict[Path, Any], device: Any, path: Path = ()) -> tuple[float, float]:
    """(seconds, bytes) of the loop trips XLA's cost analysis leaves out: (trips - 1) times the body's own."""
    extra, moved = 0.0, 0.0
    for position, eqn in enumerate(jaxpr.eqns):
        here, name = (*path, position), eqn.primitive.name
        called = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
        if name in ("while", "scan"):
            record = records.get(here)
            trips = float(eqn.params["length"]) if record is None else float(np.sum(record))
            if trips > 1:
                body = eqn.params["body_jaxpr" if name == "while" else "jaxpr"]
                shapes = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in body.jaxpr.invars]
                body_cost = compiled_cost(core.jaxpr_as_fun(body), shapes, device)
                extra += (trips - 1) * body_cost.seconds
                moved += (trips - 1) * body_cost.bytes
        elif name in CALL_PRIMITIVES and isinstance(called, core.ClosedJaxpr):
            seconds, nbytes = loop_extra(called.jaxpr, records, device, (*here, 0))
            extra, moved = extra + seconds, moved + nbytes
    return extra, moved
