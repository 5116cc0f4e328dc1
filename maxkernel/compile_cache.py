"""JAX's persistent compilation cache for a fleet's long-lived processes (daemons and actor workers).

A daemon or tester worker started in a dead one's place would otherwise compile again every program its
planner, coder or judge traces for a task (the task's inputs, the analysis, the judge's reference runs):
one to two seconds of CPU per task in a fresh process, taken from the live processes on a loaded host.
With a folder its fleet shares (``cache_dir``), it reads them back instead; JAX keys each entry by the
program, the compile options and its own version, so what is read back is what would have been compiled.
Only those trusted processes write there: the evaluator's sandbox workers, which run candidate code, are
started without the cache (``jaxbench.pool.worker_env``) and may not write outside their own temp folder.
"""

from __future__ import annotations

from pathlib import Path

import structlog

log = structlog.get_logger(__name__)


def use_compile_cache(folder: Path) -> Path:
    """Compile through a persistent cache in ``folder`` (every program, however quick to compile: a task's
    small programs are what a fresh process spends its first second on). Call before the first compile."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    folder.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    compilation_cache.reset_cache()  # a cache looked at before this (and found unset) is looked at again
    log.debug("compile_cache.on", folder=str(folder))
    return folder
