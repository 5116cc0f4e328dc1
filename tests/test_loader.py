"""One loader for candidates and references: kernels load as people write them.

``from __future__ import annotations`` with dataclasses (the module must be in ``sys.modules`` while it runs),
module-level constant tables never written after import, ``functools.partial`` and helpers in the same file;
the same for a task's own ``reference.py``. A table that is written, or aliased, is still a cache.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from jaxbench.candidate import CandidateError, load_candidate
from jaxbench.static_checks import scan
from jaxbench.task import load_task
from maxkernel.targets.loader import CandidateLoadError
from maxkernel.targets.loader import load_candidate as load_for_target

TASK_YAML = """\
id: loader_rmsnorm
name: LoaderRMSNorm
category: normalization
description: y = x / sqrt(mean(x^2) + eps) * w, written with a dataclass and a constant table.
dtype: float32
tolerance: {atol: 1.0e-5, rtol: 1.0e-5}
sizes:
  cpu: {rows: 64, hidden: 256}
  full: {rows: 256, hidden: 256}
"""

# The reference as a person writes one: future annotations, a dataclass, a CONFIG dict.
REFERENCE = '''\
from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

CONFIG = {"scale": 0.1, "eps": 1e-6}


@dataclass(frozen=True)
class Norm:
    eps: float

    def __call__(self, x: jax.Array, w: jax.Array) -> jax.Array:
        ms = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
        return x * jax.lax.rsqrt(ms + self.eps) * w


def get_inputs(key, *, rows, hidden):
    kx, kw = jax.random.split(key)
    x = jax.random.normal(kx, (rows, hidden), jnp.float32)
    w = 1.0 + CONFIG["scale"] * jax.random.normal(kw, (hidden,), jnp.float32)
    return (x, w), {"eps": CONFIG["eps"]}


def reference(x, w, *, eps):
    return Norm(eps)(x, w)
'''

CANDIDATE = '''\
from __future__ import annotations

import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BLOCK_ROWS = {64: 32, 256: 128}


@dataclass(frozen=True)
class Tiling:
    rows: int
    hidden: int

    @property
    def block(self) -> int:
        return BLOCK_ROWS.get(self.rows, 8)


def _body(x_ref, w_ref, o_ref, *, eps: float) -> None:
    x = x_ref[...]
    ms = jnp.mean(x * x, axis=-1, keepdims=True)
    o_ref[...] = x * jax.lax.rsqrt(ms + eps) * w_ref[...]


def _specs(t: Tiling):
    row = pl.BlockSpec((t.block, t.hidden), lambda i: (i, 0))
    return [row, pl.BlockSpec((1, t.hidden), lambda i: (0, 0))], row


def kernel(x, w, *, eps):
    t = Tiling(*x.shape)
    in_specs, out_spec = _specs(t)
    return pl.pallas_call(functools.partial(_body, eps=eps), grid=(t.rows // t.block,), in_specs=in_specs,
                          out_specs=out_spec, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x, w[None, :])
'''


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    folder = tmp_path_factory.mktemp("tasks") / "loader_rmsnorm"
    folder.mkdir()
    (folder / "task.yaml").write_text(TASK_YAML)
    (folder / "reference.py").write_text(REFERENCE)
    return load_task(folder)


def test_a_reference_written_with_a_dataclass_and_a_config_table_loads(task) -> None:  # type: ignore[no-untyped-def]
    args, static = task.get_inputs(__import__("jax").random.key(0), "cpu")
    assert static == {"eps": 1e-6} and task.reference(*args, **static).shape == (64, 256)


def test_a_kernel_written_as_people_write_them_loads_and_passes(task, quick_evaluator) -> None:  # type: ignore[no-untyped-def]
    assert scan(CANDIDATE)[0] == []
    loaded = load_candidate(CANDIDATE, "candidate.py")
    assert loaded.module.Tiling(64, 256).block == 32
    report = quick_evaluator.evaluate(task, CANDIDATE, size="cpu")
    assert report.status == "ok" and report.correct, report.reason


def test_the_target_loader_is_the_same_loader() -> None:
    module = load_for_target(CANDIDATE)
    assert module.Tiling(256, 256).block == 128
    with pytest.raises(CandidateLoadError, match=r"candidate line 3: import failed: NameError"):
        load_for_target("import jax\n\nx = undefined_name\n")
    with pytest.raises(CandidateLoadError, match="does not define a callable kernel"):
        load_for_target("import jax\n")
    with pytest.raises(CandidateError, match="syntax error at line 1"):
        load_candidate("def kernel(:\n")


@pytest.mark.parametrize("source", [
    "CACHE = {}\n\ndef kernel(x):\n    CACHE[1] = x\n    return x\n",
    "CACHE = {1: 2}\n\ndef kernel(x):\n    c = CACHE\n    c[id(x)] = x\n    return x\n",
    "CACHE = {1: 2}\n\ndef kernel(x):\n    CACHE.update({2: x})\n    return x\n",
    "TABLE = {1: [1]}\n\ndef kernel(x):\n    TABLE[1].append(x)\n    return x\n",
    "TABLE = [1, 2]\n\ndef kernel(x):\n    TABLE.append(x)\n    return x\n",
], ids=["written", "aliased", "updated", "mutable-values", "appended"])
def test_a_table_that_is_written_or_aliased_is_still_a_cache(source: str) -> None:
    assert [f.rule for f in scan(source)[0]] == ["module-level-cache"]
