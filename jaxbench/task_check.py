"""Checks that a task itself is sound: inputs and reference run, sizes fit, outputs depend on every input.

Run ``python -m jaxbench.task_check [TASK ...]`` while writing a task; the suite tests call
:func:`check_task` on every task.
"""

from __future__ import annotations

import random
import sys
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxbench.compare import compare_outputs, tree_leaves
from jaxbench.task import Task, TaskError, list_tasks, load_task

REF_MS_RANGE = (5.0, 300.0)
INPUT_GEN_LIMIT_S = 1.0


@dataclass
class TaskCheck:
    task_id: str
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    ref_ms: float = 0.0
    inputs_s: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems


def _block(tree: Any) -> Any:
    return jax.tree_util.tree_map(lambda x: x.block_until_ready() if hasattr(x, "block_until_ready") else x, tree)


def median_ms(fn: Any, args: tuple[Any, ...], repeats: int = 7) -> float:
    _block(fn(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        _block(fn(*args))
        times.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(times))


def full_shapes(task: Task, size: str = "full") -> tuple[Any, dict[str, Any], Any]:
    """Abstract inputs, static values and output shapes at ``size`` without allocating anything."""
    captured: dict[str, Any] = {}

    def gen(key: Any) -> Any:
        args, static = task.get_inputs(key, size)
        captured.update(static)
        return args

    arg_shapes = jax.eval_shape(gen, jax.random.key(0))
    out_shapes = jax.eval_shape(partial(task.reference, **captured), *arg_shapes)
    return arg_shapes, captured, out_shapes


def _differs(a: Any, b: Any) -> bool:
    return any(not np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(tree_leaves(a), tree_leaves(b)))


def check_free_sizes(task: Task, draws: int = 2) -> list[str]:
    """Problems with the task's free sizes: the reference must run at sizes drawn as the evaluator draws them."""
    if not task.spec.free:
        return []
    rng = random.Random(task.id)
    problems = []
    for i in range(draws):
        try:
            values = task.draw_unseen("cpu", rng)
        except TaskError as exc:
            return [str(exc)]
        if all(values[name] == task.spec.sizes["cpu"][name] for name in task.spec.free):
            problems.append(f"free sizes {sorted(task.spec.free)} cannot be drawn away from the cpu size")
            break
        drawn = task.with_size(f"unseen_{i}", values)
        shown = ", ".join(f"{name}={values[name]}" for name in task.spec.free)
        try:
            args, static = drawn.get_inputs(jax.random.key(i), f"unseen_{i}")
            out = _block(jax.jit(partial(task.reference, **static))(*args))
        except Exception as exc:
            first = (str(exc).strip().splitlines() or [""])[0]
            problems.append(f"reference fails at drawn size {shown} {type(exc).__name__}: {first}")
            continue
        for j, leaf in enumerate(tree_leaves(out)):
            arr = np.asarray(leaf)
            if (arr.dtype.kind == "f" or arr.dtype == jnp.bfloat16) and not np.isfinite(arr.astype(np.float64)).all():
                problems.append(f"output {j} has NaN/Inf at drawn size {shown}")
    return problems


def check_statics(task: Task, args: tuple[Any, ...], static: dict[str, Any], out: Any) -> list[str]:
    """Problems with the task's declared static ranges: each static must be one ``get_inputs`` returns, the
    reference must run to finite outputs with the statics drawn as the evaluator draws them, and the output
    must follow each one (a static the output does not follow is a check that cannot fail)."""
    problems: list[str] = []
    rng = random.Random(task.id)
    for name in task.spec.statics:
        try:
            drawn = task.draw_statics(static, rng)
        except TaskError as exc:
            return [str(exc)]
        moved = {**static, name: drawn[name]}
        try:
            again = _block(jax.jit(partial(task.reference, **moved))(*args))
        except Exception as exc:
            first = (str(exc).strip().splitlines() or [""])[0]
            problems.append(f"reference fails with static {name}={drawn[name]}: {type(exc).__name__}: {first}")
            continue
        if any(not np.isfinite(np.asarray(leaf).astype(np.float64)).all() for leaf in tree_leaves(again)
               if np.asarray(leaf).dtype.kind == "f" or leaf.dtype == jnp.bfloat16):
            problems.append(f"an output has NaN/Inf with static {name}={drawn[name]}")
        elif compare_outputs(jax.device_get(out), jax.device_get(again), task.spec.tolerance.atol,
                             task.spec.tolerance.rtol).ok:
            problems.append(f"the output stays within tolerance when static {name} is redrawn ({static[name]} -> "
                            f"{drawn[name]}): a kernel that ignores it would pass; do not declare it")
    return problems


def check_task(task: Task, timing: bool = True) -> TaskCheck:
    result = TaskCheck(task.id)
    try:
        args, static = _block(task.get_inputs(jax.random.key(0), "cpu"))
        t0 = time.perf_counter()  # the second draw: op compilation is paid once per process
        args2, static2 = _block(task.get_inputs(jax.random.key(1), "cpu"))
        result.inputs_s = time.perf_counter() - t0
    except TaskError as exc:
        result.problems.append(str(exc))
        return result
    if result.inputs_s > INPUT_GEN_LIMIT_S:
        result.problems.append(f"get_inputs took {result.inputs_s:.2f} s at cpu size (limit {INPUT_GEN_LIMIT_S} s)")
    if static != static2:
        result.problems.append("static values differ between keys; they must depend on size only")
    for i, a in enumerate(args):
        if not isinstance(a, jax.Array) or jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
            result.problems.append(f"arg {i} is {type(a).__name__}; args must be plain jax arrays (raw uint32 keys)")
    if result.problems:
        return result

    fn = jax.jit(partial(task.reference, **static))
    try:
        out = _block(fn(*args))
    except Exception as exc:
        result.problems.append(f"reference failed: {type(exc).__name__}: {exc}")
        return result
    leaves = tree_leaves(out)
    for i, leaf in enumerate(leaves):
        arr = np.asarray(leaf)
        if arr.dtype.kind == "f" or arr.dtype == jnp.bfloat16:
            if not np.isfinite(arr.astype(np.float64)).all():
                result.problems.append(f"output {i} has NaN/Inf")
            elif arr.size > 1 and float(np.std(arr.astype(np.float64))) == 0.0:
                result.problems.append(f"output {i} is constant")
    if str(leaves[0].dtype) != task.spec.dtype:
        result.problems.append(f"first output dtype {leaves[0].dtype} != task dtype {task.spec.dtype}")

    # Every argument matters: swapping it for the same argument drawn with another key changes the output.
    for i in range(len(args)):
        swapped = args[:i] + (args2[i],) + args[i + 1 :]
        if np.array_equal(np.asarray(args[i]), np.asarray(args2[i])):
            result.problems.append(f"arg {i} is identical for two keys; move it to static or make it random")
            continue
        try:
            if not _differs(out, _block(fn(*swapped))):
                result.problems.append(f"output does not change when arg {i} changes")
        except Exception as exc:
            result.problems.append(f"arg {i} drawn with another key is not a valid input: {type(exc).__name__}: {exc}")

    # Tolerance must reject an f32 task computed from bf16-rounded inputs (silent precision drop).
    if task.spec.dtype == "float32":
        rounded = tuple(
            a.astype(jnp.bfloat16).astype(a.dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a for a in args
        )
        low = _block(fn(*rounded))
        cmp = compare_outputs(jax.device_get(out), jax.device_get(low), task.spec.tolerance.atol, task.spec.tolerance.rtol)
        if cmp.ok:
            result.notes.append("bf16-rounded inputs pass the tolerance (precision drop would go unnoticed)")

    # Full size: shapes only (eval_shape), so the TPU-scale spec is at least well-formed and traceable.
    try:
        full_shapes(task)
    except Exception as exc:
        result.problems.append(f"full size does not trace: {type(exc).__name__}: {exc}")

    result.problems.extend(check_statics(task, args, static, out))

    if task.spec.free:
        result.problems.extend(check_free_sizes(task, draws=1 if not timing else 2))
    else:
        result.notes.append("no free sizes declared: kernels are checked at the declared sizes only")

    if timing:
        result.ref_ms = median_ms(fn, args)
        lo, hi = REF_MS_RANGE
        if not lo <= result.ref_ms <= hi:
            result.problems.append(f"reference takes {result.ref_ms:.1f} ms at cpu size (want {lo}-{hi} ms)")
    return result


def main(argv: list[str]) -> int:
    try:
        tasks = [load_task(a) for a in argv] if argv else list_tasks()
    except TaskError as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    failed = 0
    for task in tasks:
        res = check_task(task)
        mark = "ok  " if res.ok else "FAIL"
        print(f"{mark} {task.id:55s} ref {res.ref_ms:8.1f} ms  inputs {res.inputs_s:5.2f} s")
        for p in res.problems:
            print(f"     problem: {p}")
        for n in res.notes:
            print(f"     note: {n}")
        failed += not res.ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
