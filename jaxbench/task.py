"""Loading JaxBench tasks: a folder holding ``task.yaml`` and ``reference.py``.

A task may be named by its suite id (``12p_RMSNorm``) or by any folder path; both load the same way.
"""

from __future__ import annotations

import hashlib
import random
import sys
from functools import cached_property
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

SUITE_DIR = Path(__file__).parent / "tasks"
MODELS_DIR = Path(__file__).parent / "models"  # whole model layers: category "model", not among the 50

Category = Literal[
    "matmul",
    "attention",
    "normalization",
    "reduction",
    "elementwise",
    "conv",
    "moe",
    "recurrence",
    "gather",
    "model",
]


class TaskError(Exception):
    """A task folder that cannot be used: missing files, bad YAML, a broken reference."""


class Tolerance(BaseModel):
    model_config = ConfigDict(extra="forbid")
    atol: float = Field(gt=0)
    rtol: float = Field(ge=0)


class FreeSize(BaseModel):
    """A size parameter the reference accepts at any value on its grid: a kernel must serve them all."""

    model_config = ConfigDict(extra="forbid")
    multiple_of: int = Field(default=1, ge=1, description="the reference needs the value to be a multiple of this")
    min: int = Field(default=1, ge=1)
    max: int | None = Field(default=None, ge=1, description="the largest value the task's inputs allow")


class StaticRange(BaseModel):
    """A numeric static argument the reference is valid for anywhere in ``[min, max]``: a kernel must take it
    as given, so the evaluator redraws it as it redraws free sizes."""

    model_config = ConfigDict(extra="forbid")
    min: float
    max: float
    integer: bool = Field(default=False, description="the static is an integer (drawn as one)")


class TaskSpec(BaseModel):
    """The content of ``task.yaml``."""

    model_config = ConfigDict(extra="forbid")
    id: str
    name: str
    category: Category
    description: str
    dtype: Literal["float32", "bfloat16", "float16"]
    tolerance: Tolerance
    sizes: dict[str, dict[str, Any]]
    source: str | None = None  # the public configuration a model layer's shapes come from
    free: dict[str, FreeSize] = Field(
        default_factory=dict, description="size parameters a kernel must serve at any value (batch, tokens, ...)"
    )
    statics: dict[str, StaticRange] = Field(
        default_factory=dict, description="numeric static arguments a kernel must serve at any value in a range"
    )


class Task:
    """A loaded task: its spec, its folder, and (lazily) its reference module."""

    def __init__(self, spec: TaskSpec, path: Path, static_overrides: dict[str, Any] | None = None) -> None:
        self.spec = spec
        self.path = path
        self.static_overrides = dict(static_overrides or {})  # statics redrawn by the evaluator

    def __repr__(self) -> str:
        return f"Task({self.id!r}, path={str(self.path)!r})"

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def reference_path(self) -> Path:
        return self.path / "reference.py"

    @cached_property
    def source_digest(self) -> str:
        """Hash of task.yaml + reference.py: keys caches of reference outputs and task checks."""
        h = hashlib.sha256()
        h.update((self.path / "task.yaml").read_bytes())
        h.update(self.reference_path.read_bytes())
        return h.hexdigest()[:16]

    def size(self, name: str) -> dict[str, Any]:
        if name not in self.spec.sizes:
            raise TaskError(f"{self.path}/task.yaml: no size {name!r} (has {sorted(self.spec.sizes)})")
        return dict(self.spec.sizes[name])

    def with_size(self, name: str, values: dict[str, Any]) -> "Task":
        """The same task (same folder, same reference) with one more named size, e.g. a derived check size."""
        sizes = {**self.spec.sizes, name: dict(values)}
        task = Task(self.spec.model_copy(update={"sizes": sizes}), self.path, self.static_overrides)
        for cached in ("source_digest", "module"):  # already read: a sandboxed process may not read them again
            if cached in self.__dict__:
                task.__dict__[cached] = self.__dict__[cached]
        return task

    def with_statics(self, values: dict[str, Any]) -> "Task":
        """The same task whose ``get_inputs`` returns these static values instead of its own."""
        task = Task(self.spec, self.path, {**self.static_overrides, **values})
        for cached in ("source_digest", "module"):
            if cached in self.__dict__:
                task.__dict__[cached] = self.__dict__[cached]
        return task

    def draw_statics(self, current: dict[str, Any], rng: random.Random) -> dict[str, Any]:
        """A value for every declared static, drawn in its range and away from ``current`` (by at least a
        tenth of the range), so that a kernel that hard-codes the usual value is wrong there."""
        drawn: dict[str, Any] = {}
        for name, bounds in self.spec.statics.items():
            if name not in current:
                raise TaskError(f"{self.path}/task.yaml: static {name!r} is not returned by get_inputs()")
            value = float(current[name])
            for _ in range(64):
                pick = rng.uniform(bounds.min, bounds.max)
                pick = float(round(pick)) if bounds.integer else float(f"{pick:.4g}")
                if abs(pick - value) >= 0.1 * (bounds.max - bounds.min):
                    break
            drawn[name] = int(pick) if bounds.integer else pick
        return drawn

    def draw_unseen(self, base: str, rng: random.Random) -> dict[str, Any]:
        """Size ``base`` with every free parameter redrawn: a size no kernel was tuned on.

        Each value lies on its parameter's grid, differs from the base, is below it where the grid has a
        value between half the base and the base (so the check costs no more than the base size), else at
        most two steps above it, and, where the grid allows, is not a multiple of 8 (so blocks tuned for
        the base do not tile it).
        """
        values = self.size(base)
        for name, free in self.spec.free.items():
            if name not in values:
                raise TaskError(f"{self.path}/task.yaml: free size {name!r} is not a parameter of size {base!r}")
            values[name] = _draw_value(int(values[name]), free, rng)
        return values

    @cached_property
    def module(self) -> ModuleType:
        """Import ``reference.py`` under a name unique to this folder."""
        from jaxbench.candidate import CandidateError, load_module, unload_module

        name = f"jaxbench_ref_{self.spec.id}_{self.source_digest}"
        if name in sys.modules:
            return sys.modules[name]
        try:  # the candidates' loader: a reference is written as people write kernels
            module = load_module(self.reference_path.read_text(), str(self.reference_path), name)
        except (OSError, UnicodeDecodeError) as exc:
            raise TaskError(f"{self.reference_path}: cannot be read: {exc}") from exc
        except CandidateError as exc:  # a broken reference is the task's fault: say where, and what was raised
            cause = exc.__cause__
            what = f"{type(cause).__name__}: {cause}" if cause is not None else exc.reason.split(": ", 1)[-1]
            raise TaskError(f"{self.reference_path}: import failed: {what}") from exc
        for attr in ("get_inputs", "reference"):
            if not callable(getattr(module, attr, None)):
                unload_module(module)
                raise TaskError(f"{self.reference_path}: does not define {attr}()")
        return module

    def get_inputs(self, key: Any, size: str = "cpu") -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Call the task's ``get_inputs(key, **size)`` and check the shape of what it returns."""
        try:
            result = self.module.get_inputs(key, **self.size(size))
        except TaskError:
            raise
        except Exception as exc:
            raise TaskError(f"{self.reference_path}: get_inputs failed: {type(exc).__name__}: {exc}") from exc
        if not (isinstance(result, tuple) and len(result) == 2):
            raise TaskError(f"{self.reference_path}: get_inputs must return (args, static)")
        args, static = result
        if not isinstance(args, tuple) or not isinstance(static, dict):
            raise TaskError(f"{self.reference_path}: get_inputs must return (tuple, dict)")
        if self.static_overrides:
            missing = sorted(set(self.static_overrides) - set(static))
            if missing:
                raise TaskError(f"{self.reference_path}: get_inputs() returns no static {missing[0]!r}")
            static = {**static, **self.static_overrides}
        return args, static

    @property
    def reference(self) -> Any:
        return self.module.reference


def _draw_value(current: int, free: FreeSize, rng: random.Random) -> int:
    step = free.multiple_of
    lo = max(free.min, step, (current // 2) // step * step)
    hi = max(current, lo) + 2 * step
    if free.max is not None:
        hi = min(hi, free.max)
    grid = [v for v in range(lo, hi + 1, step) if v % step == 0 and v != current]
    pool = [v for v in grid if v < current] or grid  # never above the base where the grid has room below it
    untiled = [v for v in pool if v % 8]
    return rng.choice(untiled or pool)


def _read_spec(folder: Path) -> TaskSpec:
    yaml_path = folder / "task.yaml"
    if not yaml_path.is_file():
        raise TaskError(f"{folder}: no task.yaml")
    if not (folder / "reference.py").is_file():
        raise TaskError(f"{folder}: no reference.py")
    try:
        raw = yaml.safe_load(yaml_path.read_text())
    except yaml.YAMLError as exc:
        raise TaskError(f"{yaml_path}: invalid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise TaskError(f"{yaml_path}: expected a mapping at the top level")
    try:
        spec = TaskSpec.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise TaskError(f"{yaml_path}: {where}: {first['msg']}") from exc
    for required in ("cpu", "full"):
        if required not in spec.sizes:
            raise TaskError(f"{yaml_path}: sizes must include {required!r}")
    for name, bounds in spec.statics.items():
        if not bounds.min < bounds.max:
            raise TaskError(f"{yaml_path}: statics.{name}: min must be below max")
    for name in spec.free:
        missing = [size for size, values in spec.sizes.items() if name not in values]
        if missing:
            raise TaskError(f"{yaml_path}: free size {name!r} is not a parameter of sizes {missing}")
    return spec


def resolve_task_path(name_or_path: str | Path) -> Path:
    """A suite id, the number that starts one (``8p`` for ``8p_GEMM``), or a path to a task folder."""
    candidate = Path(name_or_path)
    if candidate.is_dir():
        return candidate.resolve()
    for folder in (SUITE_DIR, MODELS_DIR):
        if (folder / str(name_or_path)).is_dir():
            return folder / str(name_or_path)
    prefixed = sorted(SUITE_DIR.glob(f"{name_or_path}_*")) if "/" not in str(name_or_path) else []
    if len(prefixed) == 1 and prefixed[0].is_dir():
        return prefixed[0]
    raise TaskError(f"{name_or_path}: no such suite task or task folder")


def load_task(name_or_path: str | Path) -> Task:
    folder = resolve_task_path(name_or_path)
    return Task(_read_spec(folder), folder)


def check_own_id(task: Task) -> None:
    """Refuse a folder whose ``task.yaml`` id is a suite task's (or model layer's) but whose files differ: tasks
    are named by id in messages, the store and the memory, so it would be taken for that task, or it for it."""
    for folder in (SUITE_DIR, MODELS_DIR):
        known = folder / task.id
        if not (known / "task.yaml").is_file() or known.resolve() == task.path.resolve():
            continue
        if load_task(known).source_digest != task.source_digest:
            kind = "suite task" if folder == SUITE_DIR else "model layer"
            raise TaskError(f"{task.path}: its task.yaml id {task.id} is the id of a {kind} with a different "
                            f"task.yaml or reference.py; give the folder an id of its own")


def _suite_order(path: Path) -> tuple[int, str]:
    digits = "".join(ch for ch in path.name.split("_")[0] if ch.isdigit())
    return (int(digits) if digits else 10**6, path.name)


def list_tasks() -> list[Task]:
    """All tasks of the suite in their numeric order."""
    folders = sorted((p for p in SUITE_DIR.iterdir() if (p / "task.yaml").is_file()), key=_suite_order)
    return [load_task(p) for p in folders]


def list_models() -> list[Task]:
    """The model layers (``jaxbench/models/``), by id; kept apart from the suite's 50 tasks."""
    folders = sorted(p for p in MODELS_DIR.iterdir() if (p / "task.yaml").is_file())
    return [load_task(p) for p in folders]
