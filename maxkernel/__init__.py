"""MaxKernel: writes and optimizes JAX/Pallas kernels with a pool of cooperating sub-agents.

``maxkernel.optimize(task, target=..., budget_s=..., brain=...)`` runs one optimization session; it is
loaded on first use (it lives with the orchestrators), so ``import maxkernel`` stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

from maxkernel.logging import configure_quiet_default

__version__ = "0.1.0"
__all__ = ["extract", "optimize"]

configure_quiet_default()  # before any module of ours logs; `maxkernel.logging.configure("info")` shows more


def __getattr__(name: str) -> Any:
    if name == "optimize":
        from orchestrators.api import optimize

        return optimize
    if name == "extract":  # the package is callable: maxkernel.extract(fn, *example_args)
        return importlib.import_module("maxkernel.extract")
    raise AttributeError(f"module 'maxkernel' has no attribute {name!r}")
