"""The persistent compilation cache a fleet's daemons and workers share: a second process reads back what a
first compiled; the evaluator's sandbox workers are started without it; the folder is a setting."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from jaxbench.pool import worker_env
from maxkernel.config import Settings

COMPILE = textwrap.dedent("""
    import sys
    from pathlib import Path
    import jax, jax.numpy as jnp
    from maxkernel.compile_cache import use_compile_cache

    events = []
    jax.monitoring.register_event_listener(lambda name, **kw: events.append(name))
    use_compile_cache(Path(sys.argv[1]))
    jax.jit(lambda x: jnp.sin(x) * 3 + 1)(jnp.ones(16)).block_until_ready()
    print("hits", events.count("/jax/compilation_cache/cache_hits"),
          "misses", events.count("/jax/compilation_cache/cache_misses"))
""")


def _compile_in_a_fresh_process(folder: Path) -> tuple[int, int]:
    done = subprocess.run([sys.executable, "-c", COMPILE, str(folder)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert done.returncode == 0, done.stderr[-2000:]
    words = done.stdout.split()
    return int(words[words.index("hits") + 1]), int(words[words.index("misses") + 1])


def test_a_fresh_process_reads_back_what_another_compiled(tmp_path: Path) -> None:
    folder = tmp_path / "jax"
    hits, misses = _compile_in_a_fresh_process(folder)
    assert hits == 0 and misses >= 1  # every program compiled, however quick, is kept
    assert any(folder.iterdir())
    hits, misses = _compile_in_a_fresh_process(folder)
    assert hits >= 1 and misses == 0


def test_the_evaluators_workers_are_started_without_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "/tmp/somewhere")
    assert "JAX_COMPILATION_CACHE_DIR" not in worker_env()
    assert "JAX_COMPILATION_CACHE_DIR" not in worker_env(alike=False)


def test_the_cache_folder_is_the_data_folder_unless_set(tmp_path: Path) -> None:
    assert Settings(data_dir=str(tmp_path / "data")).cache_path == tmp_path / "data"
    shared = Settings(data_dir=str(tmp_path / "data"), cache_dir=str(tmp_path / "shared")).cache_path
    assert shared == tmp_path / "shared" and shared.is_dir()
