"""Signature and docstring of a JAX / Pallas name, for the LLM's `lookup_api` tool.

Only names under jax (and the usual aliases pl, pltpu, jnp, lax) resolve: the tool imports modules, so
it must not become a way to import arbitrary code.
"""

from __future__ import annotations

import importlib
import inspect

ALIASES = {
    "pl": "jax.experimental.pallas",
    "pltpu": "jax.experimental.pallas.tpu",
    "jnp": "jax.numpy",
    "lax": "jax.lax",
}


def lookup_api(name: str, max_chars: int = 2500) -> str:
    name = name.strip().strip("`").removesuffix("()")
    head, _, rest = name.partition(".")
    if head in ALIASES:
        name = ALIASES[head] + ("." + rest if rest else "")
    if not (name == "jax" or name.startswith("jax.")):
        return f"{name}: only jax names can be looked up (jax.*, pl.*, pltpu.*, jnp.*, lax.*)"
    parts = name.split(".")
    obj = None
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return f"{name}: not found ({'.'.join(parts[:cut])} has no attribute path {'.'.join(parts[cut:])})"
        break
    if obj is None:
        return f"{name}: not found"
    try:
        signature = f"{parts[-1]}{inspect.signature(obj)}"
    except (TypeError, ValueError):
        signature = parts[-1]
    doc = inspect.getdoc(obj) or "(no docstring)"
    return f"{name}\n{signature}\n\n{doc}"[:max_chars]
