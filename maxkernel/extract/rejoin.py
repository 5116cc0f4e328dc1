"""The re-join check: the region tasks, run one after another on the layer's inputs, give the layer's output."""

from __future__ import annotations

from functools import partial
from typing import Any

import jax

from jaxbench.compare import Comparison, compare_outputs
from jaxbench.task import load_task
from maxkernel.extract.layer import Extraction
from maxkernel.extract.tasks import keyword_names


def run_regions(extraction: Extraction, args: tuple[Any, ...], kernels: dict[int, Any] | None = None,
                static: dict[str, Any] | None = None) -> tuple[Any, ...]:
    """The layer's outputs computed region by region (``kernels`` replaces a region's reference by index);
    a region reference that takes the layer's size parameters (an attention's window) gets them from
    ``static``, the layer's static arguments."""
    env: dict[str, Any] = dict(zip(extraction.inputs, args))
    for info in extraction.regions:
        region = load_task(info.path)
        fn = (kernels or {}).get(info.index) or region.reference
        reads = keyword_names(region.reference_path.read_text(), "reference")
        fn = partial(fn, **{name: (static or {})[name] for name in reads}) if reads else fn
        out = jax.jit(fn)(*[env[name] for name in info.inputs])  # the arguments' shapes pick the size
        env.update(zip(info.outputs, out if isinstance(out, tuple) else (out,)))
    return tuple(env[name] for name in extraction.outputs)


def rejoin(extraction: Extraction, seed: int = 1, size: str = "cpu") -> Comparison:
    """Compare the re-joined regions with the layer's reference on fresh inputs, at the layer's tolerance."""
    layer = load_task(extraction.layer_path)
    args, static = layer.get_inputs(jax.random.key(seed), size)
    expected = jax.jit(partial(layer.reference, **static))(*args)
    joined = run_regions(extraction, args, static=static)
    got = joined[0] if len(joined) == 1 and not isinstance(expected, tuple) else joined
    tol = layer.spec.tolerance
    return compare_outputs(jax.device_get(expected), jax.device_get(got), tol.atol, tol.rtol)
